"""Reusable load scenarios: burst, sustained rate, sold-out storm, plain GET loop.

A scenario is a picklable dataclass; the driver ships it to each worker process, which calls
`prepare` (tokens, connections — not measured) and then `fire` (measured) on its shard. The
waiting-room scenario lives in waiting_room.py.

Shoppers in a burst behave like people: some press 2–3 times (`dup`: each press a new
Idempotency-Key, expected answer DUPLICATE or SOLD_OUT), some clients retry a request with
the same Idempotency-Key (`retry`: expected answer identical to the first, same coupon).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal, NamedTuple

import orjson
from flashcoupon_common import http1

from flashcoupon_loadtest.driver import WorkerContext
from flashcoupon_loadtest.http1 import Connection, ProtocolError, build_request, request_line
from flashcoupon_loadtest.stats import ISSUED, Record
from flashcoupon_loadtest.tokens import DEFAULT_AUDIENCE, DEMO_SECRET, TokenMinter

Mode = Literal["gateway", "issuer"]
USER_HEADER = "X-Flashcoupon-User"  # issuer-direct mode only; the gateway sets it from the JWT


class Press(NamedTuple):
    kind: str  # first, retry, dup
    key: str  # its Idempotency-Key
    tail: bytes  # the request's last header lines and blank line (press_tail)


@dataclass(frozen=True, slots=True)
class Shopper:
    index: int
    user: str
    lines: bytes  # header lines: auth (Bearer or user header) and optional X-Forwarded-For
    presses: tuple[Press, ...]


def press_tail(key: str) -> bytes:
    """What ends a press's request after the shopper's header lines. A press's request is
    request_line + the shopper's lines + this, all built before the clock starts."""
    return http1.header_lines({"Idempotency-Key": key}) + b"Content-Length: 0\r\n\r\n"


def classify(status: int, body: bytes) -> tuple[str, str]:
    """(outcome code, coupon code) of an issue answer."""
    try:
        data = orjson.loads(body) if body else {}
    except orjson.JSONDecodeError:
        data = {}
    if not isinstance(data, dict):
        data = {}
    if status == 201:
        return ISSUED, str(data.get("couponCode", ""))
    if status == 202:
        return "QUEUED", ""
    code = data.get("code")
    return (str(code) if code else f"HTTP_{status}"), ""


@dataclass(kw_only=True)
class IssueScenario:
    """What every issue scenario shares: who presses, how they authenticate, where."""

    event_id: str
    name: str = "issue"
    mode: Mode = "gateway"
    user_prefix: str = "shopper-"
    jwt_secret: str = DEMO_SECRET
    jwt_audience: str = DEFAULT_AUDIENCE
    # Give each shopper its own client IP (only honoured by a gateway that trusts the header),
    # so a local run from one address measures per-user, not per-IP, limits.
    forwarded_for: bool = False
    timeout: float = 10.0

    @property
    def path(self) -> str:
        if self.mode == "issuer":
            return f"/internal/v1/events/{self.event_id}/issue"
        return f"/v1/events/{self.event_id}/issue"

    def shopper_headers(self, minter: TokenMinter | None, index: int, user: str) -> dict[str, str]:
        headers = (
            {"Authorization": f"Bearer {minter.mint(user)}"}
            if minter is not None
            else {USER_HEADER: user}
        )
        if self.forwarded_for:
            headers["X-Forwarded-For"] = f"10.{index >> 16 & 255}.{index >> 8 & 255}.{index & 255}"
        return headers

    def shopper_lines(self, minter: TokenMinter | None, index: int, user: str) -> bytes:
        """The shopper's headers as request header lines, built once per shopper."""
        return http1.header_lines(self.shopper_headers(minter, index, user))

    def minter(self) -> TokenMinter | None:
        if self.mode == "issuer":
            return None
        return TokenMinter(self.jwt_secret, audience=self.jwt_audience)

    async def press(
        self, conn: Connection, lines: bytes, user: str, press: Press, due: float
    ) -> Record:
        """One request; latency counts from `due` (wall clock), so queueing shows."""
        raw = request_line(conn.target, "POST", self.path) + lines + press.tail
        p0 = time.perf_counter() - (time.time() - due)
        try:
            status, _, body = await conn.request(raw, self.timeout)
        except TimeoutError:
            return Record(due, time.perf_counter() - p0, 0, "TIMEOUT", user, press.kind)
        except ProtocolError:
            return Record(due, time.perf_counter() - p0, 0, "CONNECTION_ERROR", user, press.kind)
        latency = time.perf_counter() - p0
        code, coupon = classify(status, body)
        return Record(due, latency, status, code, user, press.kind, coupon)


@dataclass(kw_only=True)
class Burst(IssueScenario):
    """`users` distinct shoppers as fast as `concurrency` connections allow (closed loop)."""

    users: int
    concurrency: int = 200
    first_user: int = 0
    dup_fraction: float = 0.10
    retry_fraction: float = 0.05
    seed: int = 1
    # 0: as fast as the connections allow. Otherwise first presses are spread evenly over
    # this many seconds (open loop: a press that goes out late counts its lateness).
    pace_seconds: float = 0.0
    name: str = "burst"

    def __post_init__(self) -> None:
        self._shoppers: list[Shopper] = []
        self._conns: list[Connection] = []

    def plan(self, ctx: WorkerContext) -> Iterator[Shopper]:
        """This worker's shoppers, deterministic for (seed, worker index, worker count)."""
        rng = random.Random(self.seed * 1_000_003 + ctx.index)
        minter = self.minter()
        for i in range(self.first_user + ctx.index, self.first_user + self.users, ctx.count):
            user = f"{self.user_prefix}{i}"
            keys = [("first", f"{user}-k0")]
            if rng.random() < self.retry_fraction:
                keys.append(("retry", f"{user}-k0"))
            if rng.random() < self.dup_fraction:
                keys.extend(("dup", f"{user}-k{n}") for n in range(1, rng.choice((2, 3))))
            presses = tuple(Press(kind, key, press_tail(key)) for kind, key in keys)
            yield Shopper(i, user, self.shopper_lines(minter, i, user), presses)

    def connections_for(self, ctx: WorkerContext) -> int:
        share, extra = divmod(self.concurrency, ctx.count)
        return max(1, share + (1 if ctx.index < extra else 0))

    async def prepare(self, ctx: WorkerContext) -> None:
        self._shoppers = list(self.plan(ctx))
        self._conns = [Connection(ctx.target_for(s)) for s in range(self.connections_for(ctx))]
        await asyncio.gather(*(c.connect() for c in self._conns))

    async def fire(self, ctx: WorkerContext) -> list[Record]:
        out: list[Record] = []
        queue = iter(self._shoppers)  # shared by the clients: next() never awaits
        t_go = time.time()
        step = self.pace_seconds / self.users if self.users else 0.0

        async def client(conn: Connection) -> None:
            for shopper in queue:
                due = t_go + (shopper.index - self.first_user) * step
                if step and due > time.time():
                    await asyncio.sleep(due - time.time())
                for n, press in enumerate(shopper.presses):
                    start = due if step and n == 0 else time.time()
                    rec = await self.press(conn, shopper.lines, shopper.user, press, start)
                    out.append(rec)
                    ctx.tick(1, rec.code == ISSUED and press.kind != "retry")

        await asyncio.gather(*(client(c) for c in self._conns))
        for c in self._conns:
            c.close()
        return out


@dataclass(kw_only=True)
class SustainedRate(IssueScenario):
    """Open loop: `rate` requests/s for `duration` s, whatever the answers' latency.

    Request i is due at go + i/rate; a late request counts its lateness as latency. Users
    cycle through `users` distinct ids (0 = every request a new shopper).
    """

    rate: float
    duration: float
    users: int = 0
    max_connections: int = 512
    name: str = "sustained"

    async def prepare(self, ctx: WorkerContext) -> None:
        self._minter = self.minter()

    async def fire(self, ctx: WorkerContext) -> list[Record]:
        out: list[Record] = []
        idle: asyncio.Queue[Connection] = asyncio.Queue()
        opened = 0
        t0 = time.time()
        tasks = set()

        async def one(i: int, due: float) -> None:
            nonlocal opened
            if idle.empty() and opened < self.max_connections:
                opened += 1
                conn = Connection(ctx.target_for(opened))
            else:
                conn = await idle.get()
            n = i % self.users if self.users else i
            user = f"{self.user_prefix}{n}"
            lines = self.shopper_lines(self._minter, n, user)
            key = f"{user}-r{i}"
            rec = await self.press(conn, lines, user, Press("first", key, press_tail(key)), due)
            idle.put_nowait(conn)
            out.append(rec)
            ctx.tick(1, rec.code == ISSUED)

        for i in range(ctx.index, int(self.rate * self.duration), ctx.count):
            due = t0 + i / self.rate
            delay = due - time.time()
            if delay > 0:
                await asyncio.sleep(delay)
            task = asyncio.create_task(one(i, due))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        while tasks:
            await asyncio.gather(*list(tasks))
        while not idle.empty():
            idle.get_nowait().close()
        return out


def sold_out_storm(event_id: str, users: int, **kw: object) -> Burst:
    """Distinct shoppers against an event that has sold out: every answer should be 410."""
    return Burst(
        event_id=event_id,
        users=users,
        dup_fraction=0.0,
        retry_fraction=0.0,
        name="soldout-storm",
        **kw,  # type: ignore[arg-type]
    )


@dataclass(kw_only=True)
class GetLoop:
    """`total` GETs of `path` over `concurrency` connections: the hello-world ceiling test."""

    path: str
    total: int
    concurrency: int = 64
    name: str = "get-loop"

    async def prepare(self, ctx: WorkerContext) -> None:
        share = max(1, self.concurrency // ctx.count)
        self._conns = [Connection(ctx.target_for(s)) for s in range(share)]
        await asyncio.gather(*(c.connect() for c in self._conns))

    async def fire(self, ctx: WorkerContext) -> list[Record]:
        out: list[Record] = []
        todo = iter(range(ctx.index, self.total, ctx.count))

        async def client(conn: Connection) -> None:
            raw = build_request(conn.target, "GET", self.path)
            for _ in todo:
                t = time.time()
                p0 = time.perf_counter()
                status, _, _ = await conn.request(raw)
                out.append(Record(t, time.perf_counter() - p0, status, f"HTTP_{status}", "", "get"))
                ctx.tick()

        await asyncio.gather(*(client(c) for c in self._conns))
        return out
