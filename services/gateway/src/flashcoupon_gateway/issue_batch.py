"""Presses to one issuer, forwarded together: one POST /internal/v1/issue-batch per loop turn.

Every press that reaches `IssueBatcher.issue` in the same turn of the event loop, for the same
issuer (or for whichever issuer is next: GatewaySettings.issuer_routing "batch"), joins one
batch: the first schedules the send with `call_soon`, which runs after every task already woken
in this turn (a crowd's presses wake together, when their rate-limit replies arrive in one
Redis round trip), so under load batches fill by themselves and no press waits for a timer; a
quiet gateway sends batches of one. The wire format is flashcoupon_common.issue_batch; the
issuer answers each press as it would alone.

An issuer that does not decide allowances (older than them, or with IssuerSettings.
decide_allowance off) refuses a batch whose presses carry one, 400 MALFORMED_BATCH, issuing
nothing of it: each press of that batch raises AllowanceRefused, and the gateway decides the
shoppers' limits itself and sends them again (Gateway.press).

The batch is one upstream call (Forwarder.call: timeout, breaker, deadline header), so its
failure is every press's failure: each sees the same 503, 502 or timeout as a lone press
would, and the gateway treats each shopper accordingly (Gateway.issue: a 503 makes them
unsettled). A shopper who leaves mid-batch only loses their own answer.
"""

from __future__ import annotations

import asyncio
import logging

import orjson
from flashcoupon_common import issue_batch
from flashcoupon_common.http import ProblemError
from flashcoupon_common.issue_batch import BatchError, Press

from flashcoupon_gateway.metrics import ISSUE_BATCH_SIZE
from flashcoupon_gateway.pool import Sent
from flashcoupon_gateway.upstream import Answer, Forwarder, Upstream, answer_of

logger = logging.getLogger(__name__)

_Waiting = tuple[Press, "asyncio.Future[Answer]"]


class AllowanceRefused(Exception):
    """The issuer refused a batch because a press carried an allowance: nothing was issued."""


_JSON = {"Content-Type": "application/json"}


class IssueBatcher:
    def __init__(self, forwarder: Forwarder, max_batch: int) -> None:
        self.forwarder = forwarder
        self.max_batch = max_batch
        self._pending: dict[Upstream | None, list[_Waiting]] = {}
        self._sending: set[asyncio.Task[None]] = set()

    def issue(self, up: Upstream | None, press: Press) -> asyncio.Future[Answer]:
        """The issuer's answer to `press`, sent with whatever else goes to `up` this turn: a
        future to await (not a coroutine: one frame less for each press to resume through).
        `up` None: the batch of presses without an issuer goes to the next one in turn
        (Forwarder.pick_issuer), chosen when it is sent."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Answer] = loop.create_future()
        waiting = self._pending.get(up)
        if waiting is None:
            waiting = self._pending[up] = []
            loop.call_soon(self._flush, up)
        waiting.append((press, future))
        if len(waiting) >= self.max_batch:
            self._flush(up)  # full: send now; later presses this turn start a new batch
        return future

    def _flush(self, key: Upstream | None) -> None:
        waiting = self._pending.pop(key, None)
        if not waiting:
            return
        try:
            body = issue_batch.encode_presses([press for press, _ in waiting])
            up = self.forwarder.pick_issuer() if key is None else key
        except (orjson.JSONEncodeError, ProblemError) as exc:
            # A lone surrogate in a user id; or every issuer's breaker is open.
            for _, future in waiting:
                future.set_exception(_own_copy(exc))
            return
        # On the wire now, on an idle connection: the issuer starts on this batch while the
        # rest of this turn runs (the next presses, the next full batch), not a turn later
        # when the task below first runs (docs/gateway.md, "Batches on the wire at once").
        sent = self.forwarder.send_now(up, "POST", issue_batch.BATCH_PATH, _JSON, body)
        task = asyncio.get_running_loop().create_task(self._send(up, waiting, body, sent))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(
        self, up: Upstream, waiting: list[_Waiting], body: bytes, sent: Sent | None
    ) -> None:
        ISSUE_BATCH_SIZE.observe(len(waiting))
        presses = [press for press, _ in waiting]
        try:
            answers = await self._call(up, presses, body, sent)
        except asyncio.CancelledError:
            for _, future in waiting:
                future.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - every press of the batch fails with it
            for _, future in waiting:
                if not future.done():
                    future.set_exception(_own_copy(exc))
            return
        for (_, future), answer in zip(waiting, answers, strict=True):
            if not future.done():  # its shopper may have gone
                future.set_result(answer)

    async def _call(
        self, up: Upstream, presses: list[Press], body: bytes, sent: Sent | None
    ) -> list[Answer]:
        path = issue_batch.BATCH_PATH
        batch = await self.forwarder.call(up, "POST", path, _JSON, body, sent)
        if batch.status != 200:
            if refuses_allowances(batch, presses):
                raise AllowanceRefused(up.base_url)
            return [batch] * len(presses)  # the issuer's problem for the batch, to each press
        try:
            raw = issue_batch.decode_answers(batch.body, len(presses))
        except BatchError as exc:
            logger.warning("issuer %s answered a batch wrongly: %s", up.base_url, exc)
            raise ProblemError(502, "BAD_UPSTREAM", "the issuer could not process the request")
        return [answer_of(up, "POST", path, *answer) for answer in raw]

    async def aclose(self) -> None:
        for task in list(self._sending):
            task.cancel()
        await asyncio.gather(*self._sending, return_exceptions=True)


def refuses_allowances(batch: Answer, presses: list[Press]) -> bool:
    """Whether the issuer's answer to a batch says it does not take allowances: 400
    MALFORMED_BATCH to a batch with at least one (the press shape an issuer without them
    refuses)."""
    if batch.status != 400 or not any(p.allowance for p in presses):
        return False
    try:
        problem = orjson.loads(batch.body)
    except orjson.JSONDecodeError:
        return False
    return isinstance(problem, dict) and problem.get("code") == "MALFORMED_BATCH"


def _own_copy(exc: Exception) -> Exception:
    """A problem each waiting press raises as its own (a raise extends the exception's
    traceback: one object raised in many tasks would carry all of theirs)."""
    if isinstance(exc, ProblemError):
        return ProblemError(exc.status, exc.code, exc.detail, headers=exc.headers, **exc.extra)
    if isinstance(exc, AllowanceRefused):
        return AllowanceRefused(*exc.args)
    return exc
