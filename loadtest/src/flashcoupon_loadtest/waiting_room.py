"""The waiting-room scenario: shoppers who get a 202 ticket hold it until admitted.

Each shopper presses once; a 202 QUEUED answer carries `statusUrl`. With `sse` (default) the
shopper opens that URL as `text/event-stream` and waits for the gateway's `result` event (the
gateway issues on the shopper's behalf once admitted); otherwise it polls the JSON status
every `poll_interval` and presses again, with the same Idempotency-Key, once "admitted"
(a `sold_out` state, or the stream's 410 result, ends the wait: the event sold out).
Two records per queued shopper: the 202 (kind `first`) and the final answer (kind
`admitted`, latency = the whole wait from the first press).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import orjson

from flashcoupon_loadtest.driver import WorkerContext
from flashcoupon_loadtest.http1 import Connection, ProtocolError, build_request
from flashcoupon_loadtest.scenarios import IssueScenario, classify
from flashcoupon_loadtest.stats import ISSUED, Record


def parse_sse(buffer: bytes) -> tuple[list[tuple[str, bytes]], bytes]:
    """Complete (event, data) pairs in `buffer`, and the incomplete rest."""
    events = []
    *blocks, rest = buffer.replace(b"\r\n", b"\n").split(b"\n\n")
    for block in blocks:
        name, data = "message", b""
        for line in block.split(b"\n"):
            if line.startswith(b"event:"):
                name = line[6:].strip().decode()
            elif line.startswith(b"data:"):
                data += line[5:].strip()
        if data:
            events.append((name, data))
    return events, rest


@dataclass(kw_only=True)
class WaitingRoom(IssueScenario):
    users: int
    concurrency: int = 500  # shoppers holding a ticket at once (one connection each)
    first_user: int = 0
    sse: bool = True
    poll_interval: float = 0.5
    max_wait: float = 300.0
    name: str = "waiting-room"

    async def prepare(self, ctx: WorkerContext) -> None:
        minter = self.minter()
        self._shoppers = [
            (f"{self.user_prefix}{i}", i)
            for i in range(self.first_user + ctx.index, self.first_user + self.users, ctx.count)
        ]
        self._headers = {u: self.shopper_headers(minter, i, u) for u, i in self._shoppers}

    async def fire(self, ctx: WorkerContext) -> list[Record]:
        out: list[Record] = []
        todo = iter(self._shoppers)
        share, extra = divmod(self.concurrency, ctx.count)
        slots = max(1, share + (1 if ctx.index < extra else 0))

        async def shopper_loop(slot: int) -> None:
            conn = Connection(ctx.target_for(slot))
            for user, _ in todo:
                headers = self._headers[user]
                due = time.time()
                key = f"{user}-w"
                first, status_url = await self._issue(conn, headers, user, "first", key, due)
                out.append(first)
                ctx.tick(1, first.code == ISSUED)
                if first.code != "QUEUED":
                    continue
                final = await self._follow(conn, headers, user, key, status_url, due)
                out.append(final)
                ctx.tick(1, final.code == ISSUED)
            conn.close()

        await asyncio.gather(*(shopper_loop(s) for s in range(slots)))
        return out

    async def _follow(
        self, conn: Connection, headers: dict[str, str], user: str, key: str, url: str, due: float
    ) -> Record:
        try:
            async with asyncio.timeout(self.max_wait):
                if self.sse:
                    return await self._via_sse(conn, headers, user, url, due)
                return await self._via_poll(conn, headers, user, key, url, due)
        except TimeoutError:
            return Record(due, time.time() - due, 0, "QUEUE_TIMEOUT", user, "admitted")
        except ProtocolError:
            return Record(due, time.time() - due, 0, "CONNECTION_ERROR", user, "admitted")

    async def _issue(
        self, conn: Connection, headers: dict[str, str], user: str, kind: str, key: str, due: float
    ) -> tuple[Record, str]:
        """One press; also the 202's statusUrl ("" for any other answer)."""
        raw = build_request(conn.target, "POST", self.path, {**headers, "Idempotency-Key": key})
        try:
            status, _, body = await conn.request(raw, self.timeout)
        except TimeoutError:
            return Record(due, time.time() - due, 0, "TIMEOUT", user, kind), ""
        except ProtocolError:
            return Record(due, time.time() - due, 0, "CONNECTION_ERROR", user, kind), ""
        code, coupon = classify(status, body)
        url = str(orjson.loads(body).get("statusUrl", "")) if status == 202 else ""
        return Record(due, time.time() - due, status, code, user, kind, coupon), url

    async def _via_sse(
        self, conn: Connection, headers: dict[str, str], user: str, url: str, due: float
    ) -> Record:
        raw = build_request(conn.target, "GET", url, {**headers, "Accept": "text/event-stream"})
        buffer = b""
        async for status, _, chunk in conn.stream(raw):
            if status != 200:
                code, _ = classify(status, chunk)
                return Record(due, time.time() - due, status, code, user, "admitted")
            events, buffer = parse_sse(buffer + chunk)
            for name, data in events:
                if name == "result":
                    result = orjson.loads(data)
                    status = int(result.get("status", 0))
                    code, coupon = classify(status, orjson.dumps(result.get("body")))
                    return Record(due, time.time() - due, status, code, user, "admitted", coupon)
                if name == "gone":
                    return Record(due, time.time() - due, 410, "TICKET_GONE", user, "admitted")
        return Record(due, time.time() - due, 0, "STREAM_ENDED", user, "admitted")

    async def _via_poll(
        self, conn: Connection, headers: dict[str, str], user: str, key: str, url: str, due: float
    ) -> Record:
        raw = build_request(conn.target, "GET", url, headers)
        while True:
            status, _, body = await conn.request(raw)
            state = orjson.loads(body).get("state") if status == 200 else None
            if state == "admitted":
                rec, _ = await self._issue(conn, headers, user, "admitted", key, due)
                return rec
            if state == "sold_out":  # the event sold out while this ticket waited
                return Record(due, time.time() - due, 410, "SOLD_OUT", user, "admitted")
            if status != 200 or state == "gone":
                code, _ = classify(status, body)
                return Record(due, time.time() - due, status, code, user, "admitted")
            await asyncio.sleep(self.poll_interval)
