"""JWT bearer authentication: the only place a shopper's user id comes from.

HS256 with a shared secret, or asymmetric keys from a JWKS (fetched asynchronously, cached,
refetched at most every few seconds when a token names an unknown `kid`). `exp` and `aud` are
required; `nbf`/`iat` are checked with a small leeway. The algorithm list is fixed by the
configuration, never taken from the token, so `alg: none` or an HS256 token signed with a
public key cannot pass.

Verified tokens are cached by their exact bytes until they expire: a shopper pressing the
button again sends the same token, and HMAC/RSA verification is the gateway's biggest per-request
CPU cost after HTTP itself.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import httpx
import jwt
from flashcoupon_common.http import ProblemError

from flashcoupon_gateway.settings import AuthSettings

logger = logging.getLogger(__name__)

ASYMMETRIC_ALGS = ["RS256", "RS384", "RS512", "ES256", "ES384", "PS256", "EdDSA"]
_CACHE_MAX = 200_000
_JWKS_MIN_REFETCH_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class Principal:
    user_id: str
    expires_at: float


def unauthorized(detail: str) -> ProblemError:
    return ProblemError(
        401,
        "UNAUTHORIZED",
        detail,
        headers={
            "WWW-Authenticate": f'Bearer realm="flashcoupon", error="invalid_token", '
            f'error_description="{detail}"'
        },
    )


def bearer_token(authorization: str | None) -> str:
    if not authorization:
        raise ProblemError(
            401,
            "UNAUTHORIZED",
            "missing Authorization: Bearer token",
            headers={"WWW-Authenticate": 'Bearer realm="flashcoupon"'},
        )
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise unauthorized("Authorization must be 'Bearer <token>'")
    return token.strip()


def valid_user_id(sub: Any) -> str:
    """The `sub` claim as a user id: a short printable string (it ends up in headers and keys)."""
    if not isinstance(sub, str) or not 0 < len(sub) <= 128 or not sub.isprintable():
        raise unauthorized("token subject is not a valid user id")
    if any(c in sub for c in "{}\r\n "):
        raise unauthorized("token subject is not a valid user id")
    return sub


class JWKSCache:
    """Signing keys from a JWKS URL, by `kid`; refreshed on TTL or on an unknown kid."""

    def __init__(self, url: str, ttl_seconds: float, http: httpx.AsyncClient) -> None:
        self.url = url
        self.ttl = ttl_seconds
        self.http = http
        self._keys: dict[str, jwt.PyJWK] = {}
        self._fetched_at = 0.0

    async def key(self, kid: str | None) -> jwt.PyJWK:
        now = time.monotonic()
        stale = now - self._fetched_at > self.ttl
        unknown = kid not in self._keys and now - self._fetched_at > _JWKS_MIN_REFETCH_SECONDS
        if stale or unknown or not self._keys:
            await self._refresh()
        if kid is None and len(self._keys) == 1:
            return next(iter(self._keys.values()))
        if kid is None or kid not in self._keys:
            raise unauthorized("token signing key is unknown")
        return self._keys[kid]

    async def _refresh(self) -> None:
        try:
            response = await self.http.get(self.url, timeout=2.0)
            response.raise_for_status()
            keys = jwt.PyJWKSet.from_dict(response.json()).keys
        except (httpx.HTTPError, jwt.PyJWKSetError, ValueError) as exc:
            logger.warning("JWKS fetch from %s failed: %s", self.url, exc)
            if not self._keys:
                raise ProblemError(
                    503,
                    "SERVICE_UNAVAILABLE",
                    "signing keys unavailable",
                    headers={"Retry-After": "5"},
                ) from None
            return  # keep serving with the keys we have
        self._keys = {k.key_id or f"_{i}": k for i, k in enumerate(keys)}
        self._fetched_at = time.monotonic()


class Authenticator:
    def __init__(self, settings: AuthSettings, *, jwks: JWKSCache | None = None) -> None:
        self.settings = settings
        self.jwks = jwks
        self._cache: dict[str, Principal] = {}

    async def authenticate(self, authorization: str | None) -> Principal:
        token = bearer_token(authorization)
        cached = self._cache.get(token)
        now = time.time()
        if cached is not None:
            if cached.expires_at + self.settings.leeway_seconds > now:
                return cached
            del self._cache[token]
            raise unauthorized("token has expired")
        principal = await self._verify(token)
        if len(self._cache) >= _CACHE_MAX:
            self._cache.clear()  # crude but bounded; refilling costs one verification each
        self._cache[token] = principal
        return principal

    async def _verify(self, token: str) -> Principal:
        s = self.settings
        try:
            if s.secret is not None:
                key: Any = s.secret
                algorithms = ["HS256"]
            else:
                assert self.jwks is not None
                header = jwt.get_unverified_header(token)
                jwk = await self.jwks.key(header.get("kid"))
                key, algorithms = jwk, [a for a in ASYMMETRIC_ALGS if a == jwk.algorithm_name]
            claims = jwt.decode(
                token,
                key,
                algorithms=algorithms,
                audience=s.audience,
                leeway=s.leeway_seconds,
                options={"require": ["exp", "sub", "aud"]},
            )
        except jwt.ExpiredSignatureError:
            raise unauthorized("token has expired") from None
        except jwt.InvalidAudienceError:
            raise unauthorized("token audience is wrong") from None
        except jwt.ImmatureSignatureError:
            raise unauthorized("token is not valid yet") from None
        except jwt.InvalidTokenError as exc:
            raise unauthorized(f"token is invalid: {type(exc).__name__}") from None
        return Principal(valid_user_id(claims.get("sub")), float(claims["exp"]))
