"""Issuer test helpers: event specs, provisioning coupons, the issue route and a raw ASGI POST.

`asgi_post` is a minimal ASGI client: httpx's per-request overhead would make a 100k burst
take minutes on two shared cores.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from flashcoupon_common import event_state, keys, lua
from flashcoupon_common.event_spec import EventSpec, TierSpec
from flashcoupon_common.holders import Holders
from flashcoupon_common.messages import Discount
from flashcoupon_common.redis_batch import NotReplicatedError

from tests.support.names import random_name

TIERS = (
    TierSpec("big", Discount("fixed", amount=10000), 10),
    TierSpec("small", Discount("percent", percent=5, max_amount=3000), 90),
)


def make_spec(
    quantity: int,
    *,
    per_user_limit: int = 1,
    start: timedelta = timedelta(minutes=-1),
    end: timedelta = timedelta(hours=1),
    event_id: str | None = None,
) -> EventSpec:
    now = datetime.now(UTC)
    return EventSpec(
        event_id=event_id or random_name("ev"),
        title="test drop",
        quantity=quantity,
        start_at=now + start,
        end_at=now + end,
        tiers=TIERS,
        per_user_limit=per_user_limit,
    )


ISSUE = "/internal/v1/events/{}/issue"


async def asgi_post(app: Any, path: str, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    """POST with an empty body straight into the ASGI app; (status, JSON body)."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 8081),
    }
    out: dict[str, Any] = {}
    body = bytearray()

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            out["status"] = message["status"]
        else:
            body.extend(message.get("body", b""))

    await app(scope, receive, send)
    return out["status"], orjson.loads(body)


async def issue_coupons(redis: Any, n: int) -> EventSpec:
    now = datetime.now(UTC)
    spec = EventSpec(
        event_id=random_name("audit"),
        title="audit drop",
        quantity=n,
        start_at=now - timedelta(minutes=1),
        end_at=now + timedelta(hours=1),
        tiers=(
            TierSpec("big", Discount("fixed", amount=10_000), 10),
            TierSpec("small", Discount("percent", percent=5, max_amount=3000), 90),
        ),
    )
    await event_state.provision(redis, spec)
    for i in range(n):
        (reply,) = await redis.eval(
            lua.ISSUE.source,
            5,
            *keys.issue_keys(spec.event_id),
            f"user-{i}",
            f"req-{i}",
            "",
            "",
            "",
        )
        assert reply[0] in (b"ISSUED", "ISSUED"), reply
    return spec


async def _nobody(event_id: str) -> frozenset[str]:
    return frozenset()


NOBODY = Holders(_nobody)  # an event whose holders are none of the users asking


def per_press(script: Callable[..., Awaitable[Any]]) -> Any:
    """IssueService's script call made of a fake that answers one press at a time:
    `script(event_id, user, request_id, traceparent, deadline, allowance)` gives the press's
    reply. What it raises fails the whole call, as a failed script run does, except that a
    NotReplicatedError (WAIT: the run's writes unconfirmed) carries every press's reply."""

    async def call(event_id: str, presses: Sequence[Any], deadline: float | None) -> list[Any]:
        replies: list[Any] = []
        unconfirmed: NotReplicatedError | None = None
        for user, rid, tp, allowance in presses:
            try:
                replies.append(await script(event_id, user, rid, tp, deadline, allowance))
            except NotReplicatedError as exc:
                unconfirmed = exc
                replies.append(exc.result)
        if unconfirmed is not None:
            raise NotReplicatedError(replies, unconfirmed.acked)
        return replies

    return call
