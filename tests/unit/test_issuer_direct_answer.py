"""IssueEdge.direct_answer's own decisions, with IssueService's script call injected (as in
test_issuer_issuance): a Later whose call is cancelled at the caller's budget answers 503 as
`issue` does; a press decided here is a Reply at once; while holders are unknown, the ASGI path."""

from __future__ import annotations

import asyncio
from typing import Any

from flashcoupon_common.holders import Holders
from flashcoupon_common.http import Reply
from flashcoupon_common.httpserver import Later
from flashcoupon_issuer.http import IssueEdge
from flashcoupon_issuer.issuance import IssueService, SoldOutCache
from starlette.applications import Starlette

from tests.support.issuer import NOBODY, per_press

_COUPON = [b"ABCD0123456789", b"big", b"fixed", b"10000", b"", b"", 1_000, 61_000]


def _scope(service: IssueService, user: str = "ann", *extra: tuple[bytes, bytes]) -> Any:
    headers = [(b"x-flashcoupon-user", user.encode()), *extra]
    return {"type": "http", "method": "POST", "path": "/internal/v1/events/ev/issue",
            "headers": headers, "state": {"service": service}}  # fmt: skip


async def test_a_call_past_the_budget_is_cancelled_and_answered_503() -> None:
    calls: list[str] = []

    async def hangs(event_id: str, user: str, *_: Any) -> Any:
        calls.append(user)
        await asyncio.Event().wait()

    service = IssueService(
        per_press(hangs), SoldOutCache(ttl=60), holders=NOBODY, deadline_margin_ms=0
    )
    edge = IssueEdge(Starlette())
    later = edge.direct_answer(_scope(service, "ann", (b"x-flashcoupon-deadline-ms", b"100")))
    assert isinstance(later, Later)
    await asyncio.wait([later.waits_on], timeout=5)
    assert later.waits_on.cancelled() and calls == ["ann"]
    reply = later.answer(later.waits_on)
    assert reply.status == 503 and b"SERVICE_UNAVAILABLE" in reply.body
    assert ("ev", "ann") in service.unsettled  # as `issue` leaves a press it could not settle


async def test_a_settled_call_is_answered_and_a_local_outcome_at_once() -> None:
    async def sells_the_last(event_id: str, user: str, *_: Any) -> Any:
        return [b"ISSUED", 0, 0, 1, *_COUPON]

    holders = Holders(_no_holders)
    service = IssueService(per_press(sells_the_last), SoldOutCache(ttl=60), holders=holders)
    edge = IssueEdge(Starlette())
    later = edge.direct_answer(_scope(service, "ann"))
    assert isinstance(later, Later)
    await later.waits_on
    reply = later.answer(later.waits_on)
    assert reply.status == 201 and b'"couponCode":"ABCD0123456789"' in reply.body
    # Sold out now, and the event's holders not yet read: the ASGI path loads them.
    assert edge.direct_answer(_scope(service, "bob")) is None
    await holders.get("ev")
    answered = edge.direct_answer(_scope(service, "bob"))
    assert isinstance(answered, Reply) and answered.status == 410
    bad = edge.direct_answer(_scope(service, "bob", (b"x-flashcoupon-allowance-limit", b"x")))
    assert isinstance(bad, Reply) and bad.status == 400


async def _no_holders(event_id: str) -> frozenset[str]:
    return frozenset()
