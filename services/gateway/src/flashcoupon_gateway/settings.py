"""The gateway's settings (FLASHCOUPON_GATEWAY_*), validated once at start-up.

The one subtle rule: a shared JWT secret that is short or a known placeholder is refused at
start-up (SettingsError naming the variable), because a guessable HS256 key lets anyone mint
tokens for any user id.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flashcoupon_common.httpserver import ServerTimeouts
from flashcoupon_common.settings import (
    FromEnv,
    RedisSettings,
    SettingsError,
    between,
    positive,
    setting,
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


def _urls(name: str, raw: str) -> tuple[str, ...]:
    urls = tuple(u.strip().rstrip("/") for u in raw.split(",") if u.strip())
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise SettingsError(f"{name}: {url!r} is not an http(s) URL")
    if not urls:
        raise SettingsError(f"{name} is required but not set")
    return urls


def _at_most_60(seconds: float) -> str | None:
    return None if seconds <= 60 else "must be at most 60"


def _url(name: str, raw: str) -> str:
    return _urls(name, raw)[0]


# How the gateway spreads presses over its issuers (docs/gateway.md, "Issuer routing"):
# "batch", each loop turn's batch whole to the next issuer in turn (fewer, fuller batches: less
# issuer CPU per press); "shopper", each shopper to the issuer their id hashes to, so a holder's
# retry after the sell-out is answered from that issuer's memory rather than by a script call.
ISSUER_ROUTINGS = ("shopper", "batch")


@dataclass(frozen=True)
class AuthSettings:
    # HS256 shared secret, or None when a JWKS is used
    secret: str | None = setting(None, env=PREFIX + "JWT_SECRET", parse=_check_secret)
    jwks_url: str | None = None
    audience: str = setting("flashcoupon", env=PREFIX + "JWT_AUDIENCE")
    leeway_seconds: float = setting(5.0, env=PREFIX + "JWT_LEEWAY_SECONDS", check=_at_most_60)
    jwks_ttl_seconds: float = 300.0

    def __post_init__(self) -> None:
        if self.jwks_url is None and self.secret is None:
            raise SettingsError(f"{PREFIX}JWT_SECRET (or {PREFIX}JWKS_URL) is required but not set")


@dataclass(frozen=True)
class LimitSettings:
    ip_per_second: float = setting(100.0, check=positive)
    ip_burst: int = 200
    # routes that are not an event's issue (wallet, queue)
    user_per_second: float = setting(10.0, check=positive)
    user_burst: int = 20
    # per-event admission cap spread over this many cluster keys
    event_shards: int = setting(8, check=between(1, 256))
    trusted_proxies: int = 0  # X-Forwarded-For hops to trust (the ingress)


@dataclass(frozen=True)
class GatewaySettings(FromEnv):
    prefix = PREFIX

    redis: RedisSettings
    auth: AuthSettings
    issuer_urls: tuple[str, ...] = setting(("http://127.0.0.1:8081",), parse=_urls)
    wallet_url: str = setting("http://127.0.0.1:8082", parse=_url)
    # Queue tickets are HMAC-signed; unset, with a key derived from the JWT secret.
    ticket_secret: str = setting("", parse=_check_secret)
    limits: LimitSettings = field(default_factory=LimitSettings)
    host: str = "127.0.0.1"
    port: int = 8080
    upstream_timeout_seconds: float = 2.0
    upstream_connections: int = 200
    # Presses to one issuer in the same event-loop turn go as one request of at most this
    # many (flashcoupon_gateway.issue_batch); 0 forwards each press alone.
    issue_batch_max: int = setting(32, check=between(0, 1024))
    issuer_routing: str = setting("batch", choices=ISSUER_ROUTINGS)
    max_in_flight: int = 2000
    max_body_bytes: int = 4096
    breaker_failures: int = 5
    breaker_open_seconds: float = 5.0
    spec_cache_seconds: float = 1.0
    ticket_ttl_seconds: int = 1800
    sse_interval_seconds: float = 0.5
    timeouts: ServerTimeouts = field(default_factory=ServerTimeouts)  # HEADER_/BODY_TIMEOUT_SECONDS

    def __post_init__(self) -> None:
        if not self.ticket_secret:
            if self.auth.secret is None:
                raise SettingsError(
                    f"{PREFIX}TICKET_SECRET is required when {PREFIX}JWKS_URL is used"
                )
            object.__setattr__(self, "ticket_secret", f"t:{self.auth.secret}")
