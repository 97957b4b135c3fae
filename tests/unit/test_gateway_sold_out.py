"""The gateway's sell-out knowledge: what counts as sold out, and which news wins."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from flashcoupon_common import keys
from flashcoupon_common.holders import Holders
from flashcoupon_common.httpserver import Later
from flashcoupon_gateway.admission import EventInfo, SpecCache
from flashcoupon_gateway.auth import Authenticator
from flashcoupon_gateway.fastpath import IssueFastPath
from flashcoupon_gateway.service import Gateway
from flashcoupon_gateway.settings import AuthSettings
from flashcoupon_gateway.sold_out import SoldOutBoard, Unsettled, sold_out_in_state
from starlette.applications import Starlette

from tests.support.gateway import AUD, SECRET, token
from tests.support.metrics import sample

NOW = 1_800_000_000_000
LIVE = {"provisioned": True, "paused": False, "end_ms": NOW + 60_000, "now_ms": NOW}


def test_sold_out_only_when_every_coupon_of_a_live_event_is_issued() -> None:
    assert sold_out_in_state(issued=10, quantity=10, **LIVE)
    assert sold_out_in_state(issued=11, quantity=10, **LIVE)  # quantity lowered to issued
    assert not sold_out_in_state(issued=9, quantity=10, **LIVE)


def test_a_paused_unknown_or_ended_event_is_never_sold_out() -> None:
    # The issuer answers PAUSED / EVENT_NOT_FOUND / ENDED for these: the gateway must not
    # answer SOLD_OUT in its place (issue 10, item 2's counterpart at the gateway).
    assert not sold_out_in_state(issued=10, quantity=10, **{**LIVE, "paused": True})
    assert not sold_out_in_state(issued=0, quantity=0, **{**LIVE, "provisioned": False})
    assert not sold_out_in_state(issued=10, quantity=10, **{**LIVE, "end_ms": NOW})


def test_channel_news_sets_and_clears() -> None:
    board = SoldOutBoard()
    board.heard(keys.SOLD_OUT_CHANNEL, "ev", at=1.0)
    assert board.is_sold_out("ev") and not board.is_sold_out("other")
    board.heard(keys.SUPPLY_CHANNEL, "ev", at=2.0)  # quantity raised: open again
    assert not board.is_sold_out("ev")


def test_a_read_older_than_the_news_does_not_undo_it() -> None:
    board = SoldOutBoard()
    board.heard(keys.SOLD_OUT_CHANNEL, "ev", at=5.0)
    board.observed("ev", False, read_started=4.0)  # started before the sell-out: stale
    assert board.is_sold_out("ev")
    board.observed("ev", False, read_started=6.0)  # newer (e.g. the event was paused since)
    assert not board.is_sold_out("ev")
    board.heard(keys.SUPPLY_CHANNEL, "ev", at=7.0)
    board.observed("ev", True, read_started=6.5)  # saw the stock before it was raised
    assert not board.is_sold_out("ev")


def test_reads_alone_decide_when_no_news_was_heard() -> None:
    # A gateway started after the sell-out, or one whose subscription missed the message.
    board = SoldOutBoard()
    board.observed("ev", True, read_started=time.monotonic())
    assert board.is_sold_out("ev")
    board.observed("ev", False, read_started=time.monotonic())
    assert not board.is_sold_out("ev")


async def test_a_sell_out_wakes_waiting_streams_at_once() -> None:
    board = SoldOutBoard()
    waiters = [asyncio.create_task(board.wait("ev", 30)) for _ in range(3)]
    other = asyncio.create_task(board.wait("other", 30))
    await asyncio.sleep(0)
    board.heard(keys.SOLD_OUT_CHANNEL, "ev")
    async with asyncio.timeout(1):
        await asyncio.gather(*waiters)
    assert not other.done()
    other.cancel()
    started = time.monotonic()
    await board.wait("ev", 30)  # already sold out: no wait at all
    assert time.monotonic() - started < 1


def test_unsettled_shoppers_are_remembered_for_a_while_and_bounded() -> None:
    unsettled = Unsettled(ttl=60, capacity=2)
    unsettled.add("ev", "ann")
    assert ("ev", "ann") in unsettled and ("ev", "bob") not in unsettled
    assert ("other", "ann") not in unsettled
    unsettled.add("ev", "bob")
    unsettled.add("ev", "cid")  # over capacity: the oldest goes
    assert ("ev", "ann") not in unsettled and ("ev", "cid") in unsettled
    unsettled.add("ev", "dan", now=time.monotonic() - 61)  # its time has passed
    assert ("ev", "dan") not in unsettled


def test_reopening_a_sold_out_event_is_told() -> None:
    reopened: list[str] = []
    board = SoldOutBoard(on_reopen=reopened.append)
    board.observed("ev", False, read_started=1.0)  # never sold out: nothing to tell
    board.heard(keys.SOLD_OUT_CHANNEL, "ev", at=2.0)
    board.heard(keys.SUPPLY_CHANNEL, "ev", at=3.0)
    assert reopened == ["ev"]


async def test_the_edge_answers_sold_out_only_to_users_holding_nothing() -> None:
    """A holder whose first answer was lost (no answer, a 503 from another gateway) presses
    again without a key after the sell-out: the gateway must forward them, so the issuer tells
    them their coupon (chaos rows gateway-redis-freeze, redis-master-*-replica)."""
    import pytest
    from flashcoupon_common.holders import Holders
    from flashcoupon_common.http import ProblemError
    from flashcoupon_gateway.service import USER_HEADER, Gateway

    async def load(event_id: str) -> frozenset[str]:
        return frozenset({"holder"})

    board = SoldOutBoard()
    g = Gateway(None, None, None, None, None, None, board, Holders(load))  # type: ignore[arg-type]
    board.heard(keys.SOLD_OUT_CHANNEL, "ev", at=1.0)
    with pytest.raises(ProblemError) as err:
        await g.check_sold_out("ev", {USER_HEADER: "crowd"})
    assert err.value.status == 410
    await g.check_sold_out("ev", {USER_HEADER: "holder"})  # forwarded
    await g.check_sold_out("ev", {USER_HEADER: "holder", "Idempotency-Key": "k"})  # forwarded
    with pytest.raises(ProblemError) as err:  # a key does not make a non-holder a holder
        await g.check_sold_out("ev", {USER_HEADER: "crowd", "Idempotency-Key": "k"})
    assert err.value.status == 410
    g.unsettled.add("ev", "crowd")  # answered 503 here: the issuer tells them
    await g.check_sold_out("ev", {USER_HEADER: "crowd", "Idempotency-Key": "k"})
    await g.check_sold_out("open", {USER_HEADER: "crowd"})  # not sold out
    unknown = Gateway(None, None, None, None, None, None, board)  # type: ignore[arg-type]
    await unknown.check_sold_out("ev", {USER_HEADER: "crowd"})  # holders unknown: forwarded


def _lane_gateway(holders: frozenset[str] | None) -> tuple[Gateway, SoldOutBoard]:
    """A Gateway with what the sold-out lane reads: board, spec cache, holders, HS256 auth."""

    async def load(event_id: str) -> frozenset[str]:
        raise AssertionError("the lane never loads holders")

    board = SoldOutBoard()
    specs = SpecCache(None, 1.0, board)  # type: ignore[arg-type]
    known = Holders(load)
    if holders is not None:
        known._known["ev"] = holders  # as if loaded at the sell-out
    g = Gateway(
        None,
        Authenticator(AuthSettings(secret=SECRET, jwks_url=None, audience=AUD)),
        None,
        None,
        specs,
        None,
        board,
        known,
    )  # type: ignore[arg-type]
    return g, board


def _read_now(g: Gateway, event_id: str = "ev") -> None:
    g.specs._cache[event_id] = (time.monotonic(), EventInfo(None))


async def test_the_sold_out_lane_answers_only_what_the_full_path_would() -> None:
    g, board = _lane_gateway(frozenset({"holder"}))
    crowd, holder = f"Bearer {token('crowd')}", f"Bearer {token('holder')}"
    assert not g.answers_sold_out_now("ev", crowd)  # not sold out
    board.heard(keys.SOLD_OUT_CHANNEL, "ev")
    assert not g.answers_sold_out_now("ev", crowd)  # state not read
    _read_now(g)
    assert g.answers_sold_out_now("ev", crowd)
    assert not g.answers_sold_out_now("ev", holder)
    assert not g.answers_sold_out_now("ev", "Bearer not-a-jwt")
    assert not g.answers_sold_out_now("ev", None)  # full path: 401
    expired = f"Bearer {token('crowd', ttl=-60)}"
    assert not g.answers_sold_out_now("ev", expired)
    g.unsettled.add("ev", "crowd")
    assert not g.answers_sold_out_now("ev", crowd)
    g.specs._cache["ev"] = (time.monotonic() - 5, g.specs._cache["ev"][1])
    other = f"Bearer {token('other')}"
    assert not g.answers_sold_out_now("ev", other)  # read is stale (and is being read again)
    board.heard(keys.SUPPLY_CHANNEL, "ev")  # re-opened
    _read_now(g)
    assert not g.answers_sold_out_now("ev", other)
    await g.specs.aclose()


def test_the_sold_out_lane_waits_for_the_holders_and_renders_the_answer_once() -> None:
    g, board = _lane_gateway(None)
    board.heard(keys.SOLD_OUT_CHANNEL, "ev")
    _read_now(g)
    assert not g.answers_sold_out_now("ev", f"Bearer {token('crowd')}")
    answer = g.sold_out_answer("ev")
    assert answer is g.sold_out_answer("ev")
    assert answer.status == 410 and b'"SOLD_OUT"' in answer.body
    assert dict(answer.headers)[b"content-type"] == b"application/problem+json"


async def test_the_lane_answers_directly_what_the_asgi_path_answers() -> None:
    """IssueFastPath.direct_answer (the server writes it as the press's head is read): the
    lane's 410 for a crowd press, counted in the route's metrics as the ASGI path counts it;
    a holder's press answered by a task of its own (a Later: the full path, without uvicorn's
    cycle); None (the ASGI path decides) for a press with a body, another route."""
    g, board = _lane_gateway(frozenset({"holder"}))
    board.heard(keys.SOLD_OUT_CHANNEL, "ev")
    _read_now(g)
    edge = IssueFastPath(Starlette(), service="lane-test")

    def scope(user: str, path: str = "/v1/events/ev/issue", *extra: tuple[bytes, bytes]) -> Any:
        headers = [(b"authorization", f"Bearer {token(user)}".encode()), *extra]
        return {"type": "http", "method": "POST", "path": path, "headers": headers,
                "state": {"gateway": g}}  # fmt: skip

    counted = {"service": "lane-test", "route": "/v1/events/{eventId}/issue", "method": "POST"}
    before = sample("flashcoupon_http_requests_total", **counted, status="410")
    assert edge.direct_answer(scope("crowd")) is g.sold_out_answer("ev")
    assert sample("flashcoupon_http_requests_total", **counted, status="410") == before + 1
    forwarded = edge.direct_answer(scope("holder"))
    assert isinstance(forwarded, Later) and isinstance(forwarded.waits_on, asyncio.Task)
    forwarded.waits_on.cancel()  # this gateway has no limiter or issuers to forward to
    with_body = scope("crowd", "/v1/events/ev/issue", (b"content-length", b"2"))
    assert edge.direct_answer(with_body) is None
    assert edge.direct_answer(scope("crowd", "/v1/events/ev")) is None
    assert edge.direct_answer({**scope("crowd"), "method": "GET"}) is None
    await g.specs.aclose()
