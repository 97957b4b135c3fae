"""Gateway test helpers: tokens signed with the test secret, events to issue, problem+json."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import jwt
from flashcoupon_common import event_state
from flashcoupon_common.event_spec import AdmissionSpec, EventSpec, TierSpec
from flashcoupon_common.messages import Discount

from tests.support.names import random_name

SECRET = "e2e-gateway-secret-" + os.urandom(12).hex()
AUD = "flashcoupon"


def token(user: str, *, secret: str = SECRET, aud: str = AUD, ttl: int = 600) -> str:
    now = int(time.time())
    claims = {"sub": user, "aud": aud, "iat": now, "exp": now + ttl}
    return jwt.encode(claims, secret, algorithm="HS256")


def bearer(user: str, **kw: Any) -> dict[str, str]:
    return {"Authorization": "Bearer " + token(user, **kw)}


async def provision(redis: Any, *, quantity: int = 1000, start_in: float = -5, **admission: Any):
    now = datetime.now(UTC)
    spec = EventSpec(
        event_id=random_name("gw"),
        title="gateway e2e",
        quantity=quantity,
        start_at=now + timedelta(seconds=start_in),
        end_at=now + timedelta(hours=1),
        tiers=(TierSpec("all", Discount("fixed", amount=1000), 100),),
        admission=AdmissionSpec(**admission),
    )
    await event_state.provision(redis, spec)
    return spec


def assert_problem(r: httpx.Response, status: int, code: str | None = None) -> None:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"] == "application/problem+json"
    if code is not None:
        assert r.json()["code"] == code, r.text
