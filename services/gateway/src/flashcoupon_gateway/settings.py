"""The gateway's settings (FLASHCOUPON_GATEWAY_*), validated once at start-up.

The one subtle rule: a shared JWT secret that is short or a known placeholder is refused at
start-up (SettingsError naming the variable), because a guessable HS256 key lets anyone mint
tokens for any user id.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from flashcoupon_common.settings import (
    RedisSettings,
    SettingsError,
    env_float,
    env_int,
    env_str,
)

PREFIX = "FLASHCOUPON_GATEWAY_"
MIN_SECRET_LENGTH = 32
_PLACEHOLDERS = ("changeme", "change-me", "changethis", "placeholder", "secret", "xxx", "todo")


def _check_secret(name: str, value: str) -> str:
    if len(value) < MIN_SECRET_LENGTH:
        raise SettingsError(f"{name} must be at least {MIN_SECRET_LENGTH} characters")
    rest = value.lower().replace("_", "-")
    for word in _PLACEHOLDERS:
        rest = rest.replace(word, "")
    # Nothing but placeholder words, separators and digits, or a run of a few characters.
    if not rest.strip("-.0123456789 ") or len(set(value)) < 8:
        raise SettingsError(f"{name} looks like a placeholder; set a random secret")
    return value


def _urls(env: Mapping[str, str], name: str, default: str) -> tuple[str, ...]:
    urls = tuple(u.strip().rstrip("/") for u in env_str(env, name, default).split(",") if u.strip())
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise SettingsError(f"{name}: {url!r} is not an http(s) URL")
    if not urls:
        raise SettingsError(f"{name} is required but not set")
    return urls


@dataclass(frozen=True)
class AuthSettings:
    secret: str | None  # HS256 shared secret, or None when a JWKS is used
    jwks_url: str | None
    audience: str
    leeway_seconds: float = 5.0
    jwks_ttl_seconds: float = 300.0


@dataclass(frozen=True)
class LimitSettings:
    ip_per_second: float = 100.0
    ip_burst: int = 200
    user_per_second: float = 10.0  # routes that are not an event's issue (wallet, queue)
    user_burst: int = 20
    event_shards: int = 8  # per-event admission cap spread over this many cluster keys
    trusted_proxies: int = 0  # X-Forwarded-For hops to trust (the ingress)


@dataclass(frozen=True)
class GatewaySettings:
    redis: RedisSettings
    auth: AuthSettings
    issuer_urls: tuple[str, ...]
    wallet_url: str
    ticket_secret: str
    limits: LimitSettings = field(default_factory=LimitSettings)
    host: str = "127.0.0.1"
    port: int = 8080
    upstream_timeout_seconds: float = 2.0
    upstream_connections: int = 200
    max_in_flight: int = 2000
    max_body_bytes: int = 4096
    breaker_failures: int = 5
    breaker_open_seconds: float = 5.0
    spec_cache_seconds: float = 1.0
    ticket_ttl_seconds: int = 1800
    sse_interval_seconds: float = 0.5

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> GatewaySettings:
        env = os.environ if env is None else env
        p = PREFIX
        jwks = env.get(p + "JWKS_URL") or None
        raw_secret = env.get(p + "JWT_SECRET") or None
        if jwks is None and raw_secret is None:
            raise SettingsError(f"{p}JWT_SECRET (or {p}JWKS_URL) is required but not set")
        secret = _check_secret(p + "JWT_SECRET", raw_secret) if raw_secret else None
        raw_ticket = env.get(p + "TICKET_SECRET") or None
        if raw_ticket is None and secret is None:
            raise SettingsError(f"{p}TICKET_SECRET is required when {p}JWKS_URL is used")
        # Queue tickets are HMAC-signed; by default with a key derived from the JWT secret.
        ticket = _check_secret(p + "TICKET_SECRET", raw_ticket) if raw_ticket else f"t:{secret}"
        limits = LimitSettings(
            ip_per_second=env_float(env, p + "IP_PER_SECOND", 100.0),
            ip_burst=env_int(env, p + "IP_BURST", 200),
            user_per_second=env_float(env, p + "USER_PER_SECOND", 10.0),
            user_burst=env_int(env, p + "USER_BURST", 20),
            event_shards=env_int(env, p + "EVENT_SHARDS", 8),
            trusted_proxies=env_int(env, p + "TRUSTED_PROXIES", 0),
        )
        if limits.event_shards < 1 or limits.event_shards > 256:
            raise SettingsError(f"{p}EVENT_SHARDS must be between 1 and 256")
        if limits.ip_per_second <= 0 or limits.user_per_second <= 0:
            raise SettingsError(f"{p}IP_PER_SECOND and {p}USER_PER_SECOND must be positive")
        issuer_urls = _urls(env, p + "ISSUER_URLS", "http://127.0.0.1:8081")
        settings = cls(
            redis=RedisSettings.from_env(env),
            auth=AuthSettings(
                secret=secret,
                jwks_url=jwks,
                audience=env_str(env, p + "JWT_AUDIENCE", "flashcoupon"),
                leeway_seconds=env_float(env, p + "JWT_LEEWAY_SECONDS", 5.0),
                jwks_ttl_seconds=env_float(env, p + "JWKS_TTL_SECONDS", 300.0),
            ),
            issuer_urls=issuer_urls,
            wallet_url=_urls(env, p + "WALLET_URL", "http://127.0.0.1:8082")[0],
            ticket_secret=ticket,
            limits=limits,
            host=env_str(env, p + "HOST", "127.0.0.1"),
            port=env_int(env, p + "PORT", 8080),
            upstream_timeout_seconds=env_float(env, p + "UPSTREAM_TIMEOUT_SECONDS", 2.0),
            upstream_connections=env_int(env, p + "UPSTREAM_CONNECTIONS", 200),
            max_in_flight=env_int(env, p + "MAX_IN_FLIGHT", 2000),
            max_body_bytes=env_int(env, p + "MAX_BODY_BYTES", 4096),
            breaker_failures=env_int(env, p + "BREAKER_FAILURES", 5),
            breaker_open_seconds=env_float(env, p + "BREAKER_OPEN_SECONDS", 5.0),
            spec_cache_seconds=env_float(env, p + "SPEC_CACHE_SECONDS", 1.0),
            ticket_ttl_seconds=env_int(env, p + "TICKET_TTL_SECONDS", 1800),
            sse_interval_seconds=env_float(env, p + "SSE_INTERVAL_SECONDS", 0.5),
        )
        if settings.auth.leeway_seconds > 60:
            raise SettingsError(f"{p}JWT_LEEWAY_SECONDS must be at most 60")
        return settings
