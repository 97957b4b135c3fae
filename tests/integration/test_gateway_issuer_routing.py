"""The gateway's issuer routing (GatewaySettings.issuer_routing) on the wire.

Two socket servers play the issuers' batch route: each records the presses of every batch it
receives and answers each press 201. `batch` routing must send one loop turn's presses whole
to one issuer and the next turn's to the other; `shopper` routing splits a turn by user id;
with every breaker open, the presses fail 503 and nothing is sent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from flashcoupon_common import issue_batch
from flashcoupon_common.http import ProblemError
from flashcoupon_common.issue_batch import Press
from flashcoupon_gateway.issue_batch import IssueBatcher
from flashcoupon_gateway.upstream import Forwarder, Upstream, issuer_index

Batches = list[tuple[int, list[str]]]  # (issuer index, the batch's user ids), in arrival order


@asynccontextmanager
async def two_issuers() -> AsyncIterator[tuple[Forwarder, Batches]]:
    batches: Batches = []

    def handler(index: int):  # type: ignore[no-untyped-def]
        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                while True:
                    head = await reader.readuntil(b"\r\n\r\n")
                    length = next(
                        int(line.split(b":", 1)[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    )
                    presses = issue_batch.decode_presses(await reader.readexactly(length))
                    batches.append((index, [p.user for p in presses]))
                    body = issue_batch.encode_answers([(201, [], b"{}")] * len(presses))
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n")
                    writer.write(b"content-length: %d\r\n\r\n%s" % (len(body), body))
                    await writer.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                writer.close()

        return handle

    servers = [await asyncio.start_server(handler(i), "127.0.0.1", 0) for i in range(2)]
    urls = tuple(f"http://127.0.0.1:{s.sockets[0].getsockname()[1]}" for s in servers)
    fwd = Forwarder(
        urls, urls[0], connections=4, timeout_seconds=2, failure_threshold=1, open_seconds=30
    )
    try:
        yield fwd, batches
    finally:
        await fwd.aclose()
        for s in servers:
            s.close()


# Users hashing to both issuers, so that `shopper` routing must split them.
USERS = [f"u{i}" for i in range(8)]
assert {issuer_index(u, 2) for u in USERS} == {0, 1}


def press(user: str) -> Press:
    return Press("spring-sale", user, None, None, None)


async def one_turn(batcher: IssueBatcher, route: dict[str, Upstream | None]) -> None:
    """Every user's press submitted in one loop turn, then all answers awaited."""
    answers = await asyncio.gather(*[batcher.issue(route[u], press(u)) for u in USERS])
    assert [a.status for a in answers] == [201] * len(USERS)


async def test_batch_routing_sends_each_turn_whole_to_the_next_issuer() -> None:
    async with two_issuers() as (fwd, batches):
        batcher = IssueBatcher(fwd, max_batch=32)
        await one_turn(batcher, dict.fromkeys(USERS))
        await one_turn(batcher, dict.fromkeys(USERS))
        await batcher.aclose()
    assert [users for _, users in batches] == [USERS, USERS]
    assert {index for index, _ in batches} == {0, 1}  # one turn each


async def test_shopper_routing_splits_a_turn_by_user() -> None:
    async with two_issuers() as (fwd, batches):
        batcher = IssueBatcher(fwd, max_batch=32)
        await one_turn(batcher, {u: fwd.pick_issuer(affinity=u) for u in USERS})
        await batcher.aclose()
    assert len(batches) == 2
    for index, users in batches:
        assert users == [u for u in USERS if issuer_index(u, 2) == index]


async def test_batch_routing_with_every_breaker_open_answers_503_and_sends_nothing() -> None:
    async with two_issuers() as (fwd, batches):
        for up in fwd.issuers:
            up.breaker.on_failure(time.monotonic())  # threshold 1: open for 30 s
        batcher = IssueBatcher(fwd, max_batch=32)
        results = await asyncio.gather(
            *[batcher.issue(None, press(u)) for u in USERS], return_exceptions=True
        )
        await batcher.aclose()
    assert batches == []
    for result in results:
        assert isinstance(result, ProblemError) and result.status == 503, result
    assert len({id(r) for r in results}) == len(USERS)  # each press raises its own
