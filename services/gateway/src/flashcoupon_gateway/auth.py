"""JWT bearer authentication: the only place a shopper's user id comes from.

HS256 with a shared secret, or asymmetric keys from a JWKS (fetched asynchronously, cached,
refetched at most every few seconds when a token names an unknown `kid`). `exp` and `aud` are
required; `nbf`/`iat` are checked with a small leeway. The algorithm list is fixed by the
configuration, never taken from the token, so `alg: none` or an HS256 token signed with a
public key cannot pass.

HS256 is verified by `verify_hs256` (hmac + orjson, ~10x cheaper than PyJWT's decode, whose
per-character base64 checks made token verification the gateway's largest CPU cost); unit tests
hold it to PyJWT's verdicts. Verified tokens are also cached by their exact bytes until they
expire, since a shopper pressing the button again sends the same token.
"""

from __future__ import annotations

import binascii
import hashlib
import hmac
import logging
import re
import time
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import httpx
import jwt
import orjson
from flashcoupon_common.http import ProblemError

from flashcoupon_gateway.settings import AuthSettings

logger = logging.getLogger(__name__)

ASYMMETRIC_ALGS = ["RS256", "RS384", "RS512", "ES256", "ES384", "PS256", "EdDSA"]
_CACHE_MAX = 200_000
_JWKS_MIN_REFETCH_SECONDS = 10.0


class Principal(NamedTuple):  # one per request: a NamedTuple, cheaper than a frozen dataclass
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
    if not isinstance(sub, str) or not _USER_ID.fullmatch(sub) or not sub.isprintable():
        raise unauthorized("token subject is not a valid user id")
    return sub


_B64_TO_STD = bytes.maketrans(b"-_", b"+/")
_STD_TO_B64 = bytes.maketrans(b"+/", b"-_")
# No blanks or braces: the id goes into a header and into Redis hash tags ({rl:u:<user>}).
_USER_ID = re.compile(r"^[^\s{}]{1,128}$")


def b64url_decode(segment: bytes) -> bytes:
    """A JWT segment's bytes (unpadded base64url, strictly); 401 when it is not one."""
    if b"+" in segment or b"/" in segment or b"=" in segment:
        raise unauthorized("token is invalid: DecodeError")
    try:  # what base64.b64decode(..., validate=True) does, one call less
        return binascii.a2b_base64(
            segment.translate(_B64_TO_STD) + b"=" * (-len(segment) % 4), strict_mode=True
        )
    except binascii.Error:
        raise unauthorized("token is invalid: DecodeError") from None


def _number(claims: dict[str, Any], name: str) -> float | None:
    value = claims.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise unauthorized(f"token is invalid: {name} must be a number")
    return float(value)


# Header segments already found acceptable: a crowd's tokens share one or two (issuer, `kid`),
# so decoding and parsing them again for every token is wasted work. Bounded: a client sending
# many different headers only makes the set refill.
_GOOD_HEADERS: set[bytes] = set()


def _check_header(h: bytes) -> None:
    try:
        header = orjson.loads(b64url_decode(h))
    except orjson.JSONDecodeError:
        raise unauthorized("token is invalid: DecodeError") from None
    if not isinstance(header, dict) or header.get("alg") != "HS256" or "crit" in header:
        raise unauthorized("token is invalid: InvalidAlgorithmError")
    if len(_GOOD_HEADERS) >= 64:
        _GOOD_HEADERS.clear()
    _GOOD_HEADERS.add(h)


class Signer(Protocol):
    """A keyed HMAC-SHA256 state: `verify_hs256` copies it per token."""

    def copy(self) -> Signer: ...
    def update(self, data: bytes, /) -> None: ...
    def digest(self) -> bytes: ...


# OpenSSL's HMAC object, which hmac.HMAC wraps in Python methods; None on a Python built
# without OpenSSL (the standard wrapper then).
_openssl_hmac: Callable[..., Signer] | None
try:
    import _hashlib

    _openssl_hmac = _hashlib.hmac_new
except ImportError:
    _openssl_hmac = None


def hs256_signer(key: bytes) -> Signer:
    """The HMAC-SHA256 state keyed once: `verify_hs256` copies it per token instead of keying
    (and looking up SHA-256) again. OpenSSL's object itself when there is one: hmac.HMAC
    wraps its copy/update/digest in Python methods (docs/gateway.md, "Token verification")."""
    if _openssl_hmac is not None:
        return _openssl_hmac(key, digestmod="sha256")
    return hmac.new(key, digestmod=hashlib.sha256)


def _b64url_of_digest(digest: bytes) -> bytes:
    """A digest as base64url without padding: what a JWT's signature segment holds."""
    return binascii.b2a_base64(digest, newline=False).translate(_STD_TO_B64).rstrip(b"=")


def verify_hs256(
    token: str, signer: Signer, *, audience: str, leeway: float, now: float
) -> dict[str, Any]:
    """The claims of an HS256 JWT whose signature, exp, nbf, iat and aud hold; else 401.
    `signer` is `hs256_signer(key)`. The signature segment must be the HMAC's canonical
    base64url, as JWT libraries write it and PyJWT insists: it is compared with the encoded HMAC,
    which is cheaper than decoding the segment, and refuses the other spellings of the same
    bytes (padding bits set), which decoding let through."""
    raw = token.encode("ascii", "replace")
    parts = raw.split(b".")
    if len(parts) != 3 or len(raw) > 8192:
        raise unauthorized("token is invalid: DecodeError")
    h, p, s = parts
    if h not in _GOOD_HEADERS:
        _check_header(h)
    try:
        claims = orjson.loads(b64url_decode(p))
    except orjson.JSONDecodeError:
        raise unauthorized("token is invalid: DecodeError") from None
    mac = signer.copy()
    mac.update(h + b"." + p)
    if not hmac.compare_digest(_b64url_of_digest(mac.digest()), s):
        raise unauthorized("token is invalid: InvalidSignatureError")
    if not isinstance(claims, dict):
        raise unauthorized("token is invalid: DecodeError")
    exp = _number(claims, "exp")
    if exp is None or "sub" not in claims or "aud" not in claims:
        raise unauthorized("token is invalid: MissingRequiredClaimError")
    if exp <= now - leeway:
        raise unauthorized("token has expired")
    nbf, iat = _number(claims, "nbf"), _number(claims, "iat")
    if (nbf is not None and nbf > now + leeway) or (iat is not None and iat > now + leeway):
        raise unauthorized("token is not valid yet")
    aud = claims["aud"]
    auds = [aud] if isinstance(aud, str) else aud
    if not isinstance(auds, list) or audience not in auds:
        raise unauthorized("token audience is wrong")
    return claims


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
        # token -> (user id, expires at): a plain tuple of a str and a float, which the garbage
        # collector stops tracking after its first pass (it does so only for exact tuples). A
        # cache of Principal objects, ~90k of them under a crowd, was walked by every full
        # collection: 20-60 ms pauses and ~3 % of the gateway's CPU (issue 13).
        self._cache: dict[str, tuple[str, float]] = {}
        self._signer = None if settings.secret is None else hs256_signer(settings.secret.encode())

    async def authenticate(self, authorization: str | None) -> Principal:
        principal = self.authenticate_now(authorization)
        if principal is None:
            token = bearer_token(authorization)
            principal = self._remember(token, await self._verify_jwks(token))
        return principal

    def authenticate_now(self, authorization: str | None) -> Principal | None:
        """The principal without awaiting anything: from the cache or by HS256 (401 when the
        token is bad); None when only a JWKS key can tell (the caller then awaits
        `authenticate`). The gateway's sold-out lane answers synchronously through this."""
        token = bearer_token(authorization)
        cached = self._cache.get(token)
        if cached is not None:
            if cached[1] + self.settings.leeway_seconds > time.time():
                return Principal(*cached)
            del self._cache[token]
            raise unauthorized("token has expired")
        if self._signer is None:
            return None
        s = self.settings
        claims = verify_hs256(
            token, self._signer, audience=s.audience, leeway=s.leeway_seconds, now=time.time()
        )
        return self._remember(
            token, Principal(valid_user_id(claims.get("sub")), float(claims["exp"]))
        )

    def _remember(self, token: str, principal: Principal) -> Principal:
        if len(self._cache) >= _CACHE_MAX:
            self._cache.clear()  # crude but bounded; refilling costs one verification each
        self._cache[token] = (principal.user_id, principal.expires_at)
        return principal

    async def _verify_jwks(self, token: str) -> Principal:
        s = self.settings
        assert self.jwks is not None
        try:
            header = jwt.get_unverified_header(token)
            jwk = await self.jwks.key(header.get("kid"))
            claims = jwt.decode(
                token,
                jwk,
                algorithms=[a for a in ASYMMETRIC_ALGS if a == jwk.algorithm_name],
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
