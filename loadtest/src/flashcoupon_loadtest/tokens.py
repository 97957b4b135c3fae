"""HS256 JWTs for simulated shoppers.

Minted with hmac directly rather than PyJWT because a demo mints 100,000 of them before the
clock starts and the hand-rolled path is ~5x cheaper; a unit test checks that PyJWT accepts
them (signature, audience, expiry), so the two cannot drift apart.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time

import orjson

DEFAULT_AUDIENCE = "flashcoupon"
# The local stack's gateway secret when none is configured (demo, e2e test, localrun).
DEMO_SECRET = "flashcoupon-demo-secret-not-for-production-0123456789"

_HEADER = base64.urlsafe_b64encode(b'{"alg":"HS256","typ":"JWT"}').rstrip(b"=")


def _b64(raw: bytes) -> bytes:
    return base64.urlsafe_b64encode(raw).rstrip(b"=")


class TokenMinter:
    """Mints `sub`=user tokens sharing one audience, issue time and expiry."""

    def __init__(
        self,
        secret: str,
        *,
        audience: str = DEFAULT_AUDIENCE,
        ttl_seconds: int = 3600,
        now: float | None = None,
    ) -> None:
        self._key = secret.encode()
        issued = int(time.time() if now is None else now)
        self._claims = {"aud": audience, "iat": issued, "exp": issued + ttl_seconds}

    def mint(self, user: str) -> str:
        payload = _b64(orjson.dumps({"sub": user, **self._claims}))
        signing_input = _HEADER + b"." + payload
        sig = _b64(hmac.new(self._key, signing_input, hashlib.sha256).digest())
        return (signing_input + b"." + sig).decode()
