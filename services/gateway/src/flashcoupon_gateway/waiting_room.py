"""Waiting room: FIFO queue tickets per event, admitted at a steady rate across all replicas.

State lives in Redis under the hash tag `{wr:<event>}` (see lua/waiting_room.lua): an arrival
counter gives each ticket its number n, and an admission cursor `a` advances at the configured
rate by the Redis server's clock; ticket n is admitted once n <= floor(a). Every replica reads
the same cursor, so admission is FIFO and at the configured rate however many replicas serve
the queue, and positions (n - floor(a)) never go backwards.

A ticket string is `<n>.<expiry>.<hmac>`: signed over event, user, n and expiry, so it is bound
to the shopper who got it and cannot be forged or moved forward; Redis additionally keeps the
user's one live ticket, which makes a re-press return the same place and an admission single-use.

The room does not decide sell-outs; it reads the process's SoldOutBoard: a sold-out event gives
no tickets and every ticket it has answers SOLD_OUT at once, without asking Redis. A shopper
who already holds a coupon of the event does not queue either (`holds`): their retry is the
issuer's to answer, with that coupon.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import logging
import math
import time
from dataclasses import dataclass
from enum import IntEnum

from flashcoupon_common import keys
from flashcoupon_common.http import ProblemError

from flashcoupon_gateway.metrics import QUEUE_LENGTH
from flashcoupon_gateway.scripts import HOLDS, WAITING_ROOM, ScriptRunner
from flashcoupon_gateway.sold_out import SoldOutBoard

logger = logging.getLogger(__name__)

_POP_MAX = 1000
_KEY_TTL_SECONDS = 24 * 3600


class TicketState(IntEnum):
    ADVANCE = 0
    ADMITTED = 1  # enter/consume: admitted and the admission is used by this call
    QUEUED = 2
    READY = 3  # status: admitted, not used yet
    GONE = 4  # used or expired
    SOLD_OUT = 5  # the event sold out: no ticket, and every ticket's answer is SOLD_OUT


@dataclass(frozen=True, slots=True)
class RoomAnswer:
    state: TicketState
    n: int
    position: int
    admitted: int  # the cursor: tickets up to this number are admitted
    arrivals: int
    server_ms: int

    def eta_seconds(self, rate: float, start_ms: int) -> int:
        before_start = max(0.0, (start_ms - self.server_ms) / 1000)
        return math.ceil(before_start + self.position / rate) if self.position else 0


def _sold_out(n: int) -> RoomAnswer:
    return RoomAnswer(TicketState.SOLD_OUT, n, 0, 0, 0, 0)


def room_keys(event_id: str) -> list[str]:
    tag = "{wr:" + event_id + "}"
    return [tag + ":seq", tag + ":cur", tag + ":q", tag + ":u", tag + ":log"]


def _sig(secret: bytes, event_id: str, user: str, n: int, expiry: int) -> str:
    msg = f"{event_id}\n{user}\n{n}\n{expiry}".encode()
    digest = hmac.digest(secret, msg, "sha256")[:16]
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def sign_ticket(secret: bytes, event_id: str, user: str, n: int, expiry: int) -> str:
    return f"{n}.{expiry}.{_sig(secret, event_id, user, n, expiry)}"


def parse_ticket(secret: bytes, event_id: str, user: str, ticket: str, now: float) -> int:
    """The ticket's number; 404 TICKET_NOT_FOUND when it is not this user's valid ticket."""
    parts = ticket.split(".")
    if len(parts) == 3 and parts[0].isdigit() and parts[1].isdigit() and len(parts[2]) < 64:
        n, expiry = int(parts[0]), int(parts[1])
        good = hmac.compare_digest(parts[2], _sig(secret, event_id, user, n, expiry))
        if good and expiry > now:
            return n
        if good:
            raise ProblemError(410, "TICKET_EXPIRED", "this queue ticket has expired")
    raise ProblemError(404, "TICKET_NOT_FOUND", "no such queue ticket for this user and event")


class WaitingRoom:
    def __init__(
        self,
        runner: ScriptRunner,
        secret: str,
        *,
        ticket_ttl_seconds: int,
        sold_out: SoldOutBoard,
        tick_seconds: float = 0.05,
    ) -> None:
        self.runner = runner
        self.sold_out = sold_out
        self.secret = secret.encode()
        self.ticket_ttl = ticket_ttl_seconds
        self.tick = tick_seconds
        # Events with a queue this replica has seen: event -> (rate, start_ms).
        self._active: dict[str, tuple[float, int]] = {}
        # The latest cursor this process read per event: (admitted, server ms, monotonic time).
        # SSE streams read positions from it instead of each polling Redis; the ticker keeps
        # it fresh. Only ever moves forward, so a stream's positions never go backwards.
        self._cursor: dict[str, tuple[int, int, float]] = {}
        self._task: asyncio.Task[None] | None = None

    async def _call(
        self, mode: str, event_id: str, rate: float, start_ms: int, user: str = "", n: int = 0
    ) -> RoomAnswer:
        raw = await self.runner.run(
            WAITING_ROOM,
            room_keys(event_id),
            [
                mode,
                rate,
                start_ms * 1000,
                user,
                n,
                self.ticket_ttl * 1_000_000,
                _KEY_TTL_SECONDS,
                _POP_MAX,
            ],
        )
        answer = RoomAnswer(TicketState(int(raw[0])), *(int(x) for x in raw[1:]))
        if answer.arrivals > answer.admitted:
            self._active[event_id] = (rate, start_ms)
        seen = self._cursor.get(event_id)
        if seen is None or answer.admitted >= seen[0]:
            self._cursor[event_id] = (answer.admitted, answer.server_ms, time.monotonic())
        QUEUE_LENGTH.labels(event_id).set(max(0, answer.arrivals - answer.admitted))
        return answer

    async def enter(self, event_id: str, user: str, rate: float, start_ms: int) -> RoomAnswer:
        if self.sold_out.is_sold_out(event_id):
            return _sold_out(0)
        return await self._call("enter", event_id, rate, start_ms, user)

    async def status(
        self, event_id: str, user: str, n: int, rate: float, start_ms: int
    ) -> RoomAnswer:
        if self.sold_out.is_sold_out(event_id):
            return _sold_out(n)
        return await self._call("status", event_id, rate, start_ms, user, n)

    async def consume(
        self, event_id: str, user: str, n: int, rate: float, start_ms: int
    ) -> RoomAnswer:
        if self.sold_out.is_sold_out(event_id):
            return _sold_out(n)
        return await self._call("consume", event_id, rate, start_ms, user, n)

    async def holds(self, event_id: str, user: str) -> bool:
        """Whether the user already holds a coupon of the event (the issuer's users hash).

        Read, not remembered: any gateway replica may have answered the 201, and the issue
        script writes the holding before the shopper sees it, so a retry always finds it.
        """
        return bool(await self.runner.run(HOLDS, [keys.users_key(event_id)], [user]))

    async def wait(self, event_id: str, seconds: float) -> None:
        """An SSE stream's pause between looks: cut short when the event sells out."""
        await self.sold_out.wait(event_id, seconds)

    async def advance(self, event_id: str, rate: float, start_ms: int) -> RoomAnswer:
        return await self._call("advance", event_id, rate, start_ms)

    def cached_position(
        self, event_id: str, n: int, rate: float, start_ms: int
    ) -> RoomAnswer | None:
        """Ticket n's position from this process's recent cursor, if n is surely still queued.

        None means: ask Redis (no fresh cursor, or n may be admitted). Watching the event keeps
        the ticker refreshing the cursor every tick.
        """
        if self.sold_out.is_sold_out(event_id):
            return _sold_out(n)
        self._active[event_id] = (rate, start_ms)
        seen = self._cursor.get(event_id)
        if seen is None or time.monotonic() - seen[2] > 4 * self.tick or n <= seen[0]:
            return None
        admitted, server_ms, _ = seen
        return RoomAnswer(TicketState.QUEUED, n, n - admitted, admitted, n, server_ms)

    def ticket(self, event_id: str, user: str, n: int) -> str:
        expiry = int(time.time()) + self.ticket_ttl
        return sign_ticket(self.secret, event_id, user, n, expiry)

    def parse(self, event_id: str, user: str, ticket: str) -> int:
        return parse_ticket(self.secret, event_id, user, ticket, time.time())

    # ---- the admission ticker: keeps the cursor and the queue gauge moving between requests
    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="waiting-room-ticker")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.tick)
            for event_id, (rate, start_ms) in list(self._active.items()):
                if self.sold_out.is_sold_out(event_id):
                    self._active.pop(event_id, None)  # its tickets are answered; nothing moves
                    continue
                try:
                    answer = await self.advance(event_id, rate, start_ms)
                except Exception as exc:  # noqa: BLE001 - keep ticking; the next tick retries
                    logger.warning("waiting room advance for %s failed: %s", event_id, exc)
                    continue
                if answer.arrivals <= answer.admitted:
                    self._active.pop(event_id, None)
