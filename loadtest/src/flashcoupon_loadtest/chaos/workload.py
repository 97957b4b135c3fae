"""The chaos workload: a sustained, paced burst of shoppers through the gateways.

Shoppers arrive at a steady rate (open loop: a slow answer does not slow the arrivals, as in
a real drop) and are spread over the gateways. Every other shopper is a client that sends an
`Idempotency-Key` with each press; one in five presses a second time right after its answer
(the keyed ones repeat their key: a retry; the others press again without one: a duplicate
press). After the fault, every shopper whose last answer told them nothing (503, another 5xx,
429, or no answer at all) retries the way a client would — same key, or none — until it gets
a decision: the 503 contract says that retry reveals the coupon they hold.

Each request becomes an `Answer` with its send time on the run's clock (seconds since the
burst began), so the checker can place it before, during or after the fault.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx
import orjson

from flashcoupon_loadtest.tokens import DEMO_SECRET, TokenMinter

UNDECIDED = {0, 429, 500, 502, 503, 504}  # answers that do not tell a shopper what they hold


@dataclass(frozen=True, slots=True)
class Answer:
    user: str
    phase: str  # "burst" or "retry"
    keyed: bool
    sent: float  # seconds since the burst began
    latency: float
    status: int  # 0: no HTTP answer (connection refused/reset, client timeout)
    code: str | None  # problem code (DUPLICATE, SOLD_OUT, ...)
    coupon: str | None  # the coupon code a 201 or a 409 DUPLICATE carried
    gateway: int

    @property
    def answered(self) -> float:
        return self.sent + self.latency


@dataclass(frozen=True)
class Plan:
    event_id: str
    shoppers: int
    rate: float  # shoppers arriving per second
    prefix: str  # user ids are <prefix>-<n>: distinct per row
    repeat_every: int = 5  # one shopper in this many presses twice
    concurrency: int = 256
    timeout: float = 10.0

    @property
    def duration(self) -> float:
        return self.shoppers / self.rate

    def user(self, n: int) -> str:
        return f"{self.prefix}-{n}"

    def keyed(self, user: str) -> bool:
        return int(user.rsplit("-", 1)[1]) % 2 == 0


class Workload:
    """Drives one plan against `gateways`; `answers` grows as requests complete."""

    def __init__(self, plan: Plan, gateways: Sequence[str], secret: str = DEMO_SECRET) -> None:
        self.plan = plan
        self.gateways = list(gateways)
        self.minter = TokenMinter(secret)
        self.answers: list[Answer] = []
        self.t0 = time.monotonic()
        self._clients: list[httpx.AsyncClient] = []

    def now(self) -> float:
        return time.monotonic() - self.t0

    async def __aenter__(self) -> Workload:
        limits = httpx.Limits(
            max_connections=self.plan.concurrency, max_keepalive_connections=self.plan.concurrency
        )
        self._clients = [
            httpx.AsyncClient(base_url=g, timeout=self.plan.timeout, limits=limits)
            for g in self.gateways
        ]
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.gather(*(c.aclose() for c in self._clients), return_exceptions=True)

    def _headers(self, user: str, n: int) -> dict[str, str]:
        headers = {
            "Authorization": f"Bearer {self.minter.mint(user)}",
            # The driver plays the ingress: one client address per shopper.
            "X-Forwarded-For": f"10.{(n >> 16) & 255}.{(n >> 8) & 255}.{n & 255}",
        }
        if self.plan.keyed(user):
            headers["Idempotency-Key"] = f"k-{user}"
        return headers

    async def press(self, n: int, phase: str, gateway: int | None = None) -> Answer:
        user = self.plan.user(n)
        g = (n if gateway is None else gateway) % len(self._clients)
        sent = self.now()
        status, code, coupon = 0, None, None
        try:
            r = await self._clients[g].post(
                f"/v1/events/{self.plan.event_id}/issue", headers=self._headers(user, n)
            )
            status = r.status_code
            try:
                body = orjson.loads(r.content)
            except orjson.JSONDecodeError:
                body = {}
            if isinstance(body, dict):
                code = body.get("code")
                held = body.get("coupon") if status == 409 else body
                if isinstance(held, dict):
                    coupon = held.get("couponCode")
        except (httpx.TransportError, httpx.TimeoutException) as exc:
            code = type(exc).__name__
        answer = Answer(
            user, phase, self.plan.keyed(user), sent, self.now() - sent, status, code, coupon, g
        )
        self.answers.append(answer)
        return answer

    async def _shopper(self, n: int, gate: asyncio.Semaphore) -> None:
        async with gate:
            first = await self.press(n, "burst")
            if n % self.plan.repeat_every == 1 and first.status not in UNDECIDED:
                await self.press(n, "burst")

    async def burst(self, on_tick: Callable[[int], None] | None = None) -> None:
        """Arrivals at `plan.rate` per second until every shopper pressed."""
        self.t0 = time.monotonic()
        gate = asyncio.Semaphore(self.plan.concurrency)
        tasks = []
        for n in range(self.plan.shoppers):
            delay = n / self.plan.rate - self.now()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(self._shopper(n, gate)))
            if on_tick is not None and n % int(self.plan.rate) == 0:
                on_tick(n)
        await asyncio.gather(*tasks)

    def undecided(self) -> list[int]:
        """Shoppers whose latest answer told them nothing about their coupon."""
        last: dict[str, Answer] = {}
        for a in self.answers:
            if a.user not in last or a.sent >= last[a.user].sent:
                last[a.user] = a
        return sorted(int(u.rsplit("-", 1)[1]) for u, a in last.items() if a.status in UNDECIDED)

    async def retry_undecided(self, within: float, pause: float = 1.0) -> list[int]:
        """Retry (same key, or none) until each has a decision; returns who never got one."""
        deadline = time.monotonic() + within
        rounds = 0
        while (pending := self.undecided()) and time.monotonic() < deadline:
            rounds += 1
            gate = asyncio.Semaphore(64)

            async def one(n: int, gate: asyncio.Semaphore = gate, r: int = rounds) -> None:
                async with gate:
                    await self.press(n, "retry", gateway=n + r)  # alternate gateways

            await asyncio.gather(*(one(n) for n in pending))
            if self.undecided():
                await asyncio.sleep(pause)
        return self.undecided()
