"""The waiting room through real gateway and issuer processes: what a sell-out and a holder's
retry do to tickets (issue 10, items 10 and 11).

A sell-out must reach every ticket at once — JSON status `sold_out`, the SSE stream's final
`result` is the 410 — and no ticket is handed out afterwards, however long after. A shopper
who holds a coupon and presses again gets that coupon back (201 replay with the same
Idempotency-Key, 409 DUPLICATE carrying it without one) without taking a queue ticket.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import orjson
import pytest
from flashcoupon_common import event_state

from tests.support.gateway import assert_problem, bearer, provision
from tests.support.names import random_name
from tests.support.polling import wait_until
from tests.support.processes import Proc, gateway_proc, issuer_proc
from tests.support.stack import Stack

# The bound a queued shopper waits, after the last coupon went, to hear about it. The old
# behaviour was up to the time the queue needed to reach the ticket (35 s in the report); the
# announcement usually lands in tens of ms, but a loaded 2-core CI machine needs headroom.
SOLD_OUT_REACHES_TICKETS_S = 5.0


@pytest.fixture(scope="module")
def issuer(stack: Stack) -> Iterator[Proc]:
    p = issuer_proc(stack).start()
    yield p
    p.stop()


@pytest.fixture(scope="module")
def gateway(stack: Stack, issuer: Proc) -> Iterator[Proc]:
    # Event state re-read only every 30 s: within a test, a sell-out reaches this gateway
    # through its subscription or not at all.
    p = gateway_proc(stack, issuer.url, spec_cache_seconds="30").start()
    yield p
    p.stop()


@pytest.fixture
async def client(gateway: Proc) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as c:
        yield c


@pytest.fixture
async def fresh_client(stack: Stack, issuer: Proc) -> AsyncIterator[httpx.AsyncClient]:
    """A gateway started now, with default settings (it heard no earlier news)."""
    p = gateway_proc(stack, issuer.url).start()
    try:
        async with httpx.AsyncClient(base_url=p.url, timeout=10) as c:
            yield c
    finally:
        p.stop()


async def queue_everyone(client: httpx.AsyncClient, eid: str, users: list[str]) -> dict[str, Any]:
    """Each user presses once, in order; their 202 bodies (some may be admitted at once)."""
    queued = {}
    for user in users:
        r = await client.post(f"/v1/events/{eid}/issue", headers=bearer(user))
        assert r.status_code in (201, 202), r.text
        if r.status_code == 202:
            queued[user] = r.json()
    return queued


async def sse_events(
    client: httpx.AsyncClient, url: str, user: str, out: list[tuple[str, Any]]
) -> None:
    headers = {**bearer(user), "Accept": "text/event-stream"}
    async with client.stream("GET", url, headers=headers, timeout=60) as r:
        assert r.status_code == 200
        name = None
        async for line in r.aiter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                out.append((name, orjson.loads(line[6:])))


async def sell_out_at_the_issuer(issuer: Proc, eid: str, quantity: int) -> None:
    """Take the rest of the stock the way another gateway's shoppers would."""
    async with httpx.AsyncClient(base_url=issuer.url, timeout=10) as direct:
        for i in range(quantity):
            r = await direct.post(
                f"/internal/v1/events/{eid}/issue", headers={"X-Flashcoupon-User": f"other-{i}"}
            )
            if r.status_code == 410:
                return
            assert r.status_code == 201, r.text


async def test_a_sell_out_reaches_every_ticket_at_once_and_closes_the_room(
    client: httpx.AsyncClient, issuer: Proc, redis_cluster: Any
) -> None:
    # Admission at 1/s: the last of 30 tickets would wait ~30 s to be told anything.
    spec = await provision(
        redis_cluster, quantity=20, waiting_room_enabled=True, waiting_room_admit_per_second=1
    )
    eid = spec.event_id
    queued = await queue_everyone(client, eid, [f"wr-so-{i}" for i in range(30)])
    assert len(queued) >= 25, len(queued)
    last = max(queued, key=lambda u: queued[u]["position"])
    assert queued[last]["position"] >= 20
    stream: list[tuple[str, Any]] = []
    sse = asyncio.create_task(sse_events(client, queued[last]["statusUrl"], last, stream))
    try:
        await wait_until(lambda: bool(stream), within=15, what="the ticket's first SSE event")
        assert not sse.done() and stream[-1][0] == "position", stream

        await sell_out_at_the_issuer(issuer, eid, spec.quantity)
        sold_at = time.monotonic()

        # Every ticket's JSON status says sold_out within the bound.
        pending = dict(queued)
        while pending and time.monotonic() - sold_at < SOLD_OUT_REACHES_TICKETS_S:
            answers = await asyncio.gather(
                *(client.get(q["statusUrl"], headers=bearer(u)) for u, q in pending.items())
            )
            for (user, _), r in zip(list(pending.items()), answers, strict=True):
                assert r.status_code == 200, r.text
                if r.json()["state"] == "sold_out":
                    del pending[user]
            await asyncio.sleep(0.05)
        waited = time.monotonic() - sold_at
        assert not pending, f"{len(pending)} tickets not told after {waited:.1f} s"
        print(f"every ticket said sold_out {waited:.2f} s after the last coupon")

        # The SSE stream pushed the 410 as its result and closed.
        await asyncio.wait_for(sse, SOLD_OUT_REACHES_TICKETS_S)
        assert stream[-1][0] == "result", stream
        assert stream[-1][1]["status"] == 410 and stream[-1][1]["body"]["code"] == "SOLD_OUT"
    finally:
        sse.cancel()

    # No ticket for a sold-out event: not now, and not after any short cache would have lapsed.
    path = f"/v1/events/{eid}/issue"
    for delay in (0, 1.5):
        await asyncio.sleep(delay)
        assert_problem(await client.post(path, headers=bearer(f"late-{delay}")), 410, "SOLD_OUT")
        keyed = {**bearer(f"late-keyed-{delay}"), "Idempotency-Key": "k1"}
        assert_problem(await client.post(path, headers=keyed), 410, "SOLD_OUT")


async def test_a_gateway_started_after_the_sell_out_gives_no_ticket(
    fresh_client: httpx.AsyncClient, issuer: Proc, redis_cluster: Any
) -> None:
    # It missed the announcement: its own read of the event's state must say sold out.
    spec = await provision(
        redis_cluster, quantity=3, waiting_room_enabled=True, waiting_room_admit_per_second=1
    )
    await sell_out_at_the_issuer(issuer, spec.event_id, spec.quantity)
    path = f"/v1/events/{spec.event_id}/issue"
    for user in ("after-1", "after-2"):
        assert_problem(await fresh_client.post(path, headers=bearer(user)), 410, "SOLD_OUT")


async def test_a_paused_or_unknown_event_is_not_sold_out_at_the_gateway(
    fresh_client: httpx.AsyncClient, redis_cluster: Any
) -> None:
    client = fresh_client
    spec = await provision(
        redis_cluster, quantity=5, waiting_room_enabled=True, waiting_room_admit_per_second=1
    )
    eid = spec.event_id
    queued = await queue_everyone(client, eid, [f"wr-pa-{i}" for i in range(5)])
    await event_state.set_paused(redis_cluster, eid, True)
    await asyncio.sleep(1.2)  # past the gateway's spec cache: it has read the paused state
    for user, q in queued.items():
        r = await client.get(q["statusUrl"], headers=bearer(user))
        assert r.status_code == 200 and r.json()["state"] != "sold_out", r.text
    r = await client.post(f"/v1/events/{eid}/issue", headers=bearer("wr-pa-new"))
    assert r.status_code != 410, r.text
    # (One press: a second one reaches the issuer, whose own memory of it is item 2's.)
    r = await client.post(f"/v1/events/{random_name('nope')}/issue", headers=bearer("wr-pa-new"))
    assert_problem(r, 404)


async def admitted_coupon(
    client: httpx.AsyncClient, eid: str, user: str, url: str, key: str
) -> httpx.Response:
    """Poll the ticket until admitted, then press with `key`: the 201."""
    for _ in range(200):
        state = (await client.get(url, headers=bearer(user))).json()["state"]
        if state != "queued":
            break
        await asyncio.sleep(0.05)
    assert state == "admitted", state
    headers = {**bearer(user), "Idempotency-Key": key}
    r = await client.post(f"/v1/events/{eid}/issue", headers=headers)
    assert r.status_code == 201, r.text
    return r


async def a_holder(
    client: httpx.AsyncClient, redis_cluster: Any, holder: str
) -> tuple[str, str, str]:
    """A waiting-room event with a queue, and `holder` holding a coupon got with key K1:
    (event id, coupon code, the room's arrival counter key)."""
    spec = await provision(
        redis_cluster, quantity=100, waiting_room_enabled=True, waiting_room_admit_per_second=2
    )
    eid = spec.event_id
    first = await client.post(
        f"/v1/events/{eid}/issue", headers={**bearer(holder), "Idempotency-Key": "K1"}
    )
    # Others queue behind, so any new ticket would have to wait (a retry that queues shows).
    await queue_everyone(client, eid, [f"{holder}-filler-{i}" for i in range(20)])
    if first.status_code == 202:
        first = await admitted_coupon(client, eid, holder, first.json()["statusUrl"], "K1")
    assert first.status_code == 201, first.text
    return eid, first.json()["couponCode"], f"{{wr:{eid}}}:seq"


async def test_a_keyed_retry_after_a_201_gets_the_coupon_at_once(
    client: httpx.AsyncClient, redis_cluster: Any
) -> None:
    eid, code, seq = await a_holder(client, redis_cluster, "wr-keyed")
    tickets_before = int(await redis_cluster.get(seq))
    for _ in range(2):
        retry = await client.post(
            f"/v1/events/{eid}/issue", headers={**bearer("wr-keyed"), "Idempotency-Key": "K1"}
        )
        assert retry.status_code == 201, retry.text
        assert retry.json()["couponCode"] == code
    assert int(await redis_cluster.get(seq)) == tickets_before  # no ticket taken


async def test_a_holder_pressing_again_gets_duplicate_with_the_coupon_and_no_ticket(
    client: httpx.AsyncClient, redis_cluster: Any
) -> None:
    eid, code, seq = await a_holder(client, redis_cluster, "wr-presser")
    tickets_before = int(await redis_cluster.get(seq))
    # No key (pressed again and again), or another key: DUPLICATE carrying the coupon.
    for extra in ({}, {}, {"Idempotency-Key": "K2"}):
        again = await client.post(
            f"/v1/events/{eid}/issue", headers={**bearer("wr-presser"), **extra}
        )
        assert_problem(again, 409, "DUPLICATE")
        assert again.json()["coupon"]["couponCode"] == code
    assert int(await redis_cluster.get(seq)) == tickets_before  # no admission slot used
