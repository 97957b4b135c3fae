"""The issuer's HTTP edge: parse, call IssueService, map the Outcome to the HTTP contract.

The user id comes only from X-Flashcoupon-User, which the gateway sets (and strips from
clients); the issuer is not reachable from outside the cluster. The header carries the id as
UTF-8 and is decoded strictly: bytes that are not UTF-8 are a 400, never a replacement
character (which made different users one, and handed one user's coupon to another).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import os
import re
import time
from collections.abc import Awaitable
from datetime import UTC, datetime
from typing import Any

import orjson
from flashcoupon_common import event_state, issue_batch, tracing, validation
from flashcoupon_common.aio import in_order
from flashcoupon_common.http import (
    JSON_HEADERS,
    PROBLEM_JSON,
    JSONResponse,
    ProblemError,
    Reply,
    error_response,
    problem,
    user_from_header,
)
from flashcoupon_common.httpserver import Later, sent_whole
from flashcoupon_common.red_metrics import RouteMetrics
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from flashcoupon_issuer.issuance import (
    AllowanceLimit,
    Coupon,
    IssuerUnavailable,
    IssueService,
    Outcome,
    PressArgs,
)

logger = logging.getLogger(__name__)

ISSUE_ROUTE = "/internal/v1/events/{eventId}/issue"
ISSUE_PREFIX = "/internal/v1/events/"
ISSUE_SUFFIX = "/issue"
SPAN_NAME = f"POST {ISSUE_ROUTE}"
SCRIPT_SPAN = "redis issue.lua"
_PROBLEM = PROBLEM_JSON.encode()

USER_HEADER = "x-flashcoupon-user"
# Milliseconds the caller (the gateway) will still wait for this answer (docs/issuer.md).
DEADLINE_HEADER = b"x-flashcoupon-deadline-ms"
_ALLOWANCE_LIMIT = issue_batch.ALLOWANCE_LIMIT_HEADER.lower().encode()
_ALLOWANCE = issue_batch.ALLOWANCE_HEADER.lower().encode()
MAX_USER_LEN = 128  # user_coupons.user_id is VARCHAR(128)
TRACEPARENT_RE = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")


# Why a batch is refused when this issuer does not decide allowances: the same status and code
# as an issuer older than the allowance gives, which is what a gateway recognises.
NO_ALLOWANCE = (
    "this issuer does not decide allowances: each press must be [eventId, userId, key or null, "
    "traceparent or null]"
)

_SECONDS: dict[int, str] = {}


def deadline_budget(value: bytes) -> int | None:
    """X-Flashcoupon-Deadline-Ms as milliseconds; a malformed value is ignored (None)."""
    return int(value) if value.isdigit() and len(value) < 9 else None


def iso(ms: int) -> str:
    """ISO-8601 UTC with milliseconds; the per-second part is cached (a burst shares seconds)."""
    seconds, millis = divmod(ms, 1000)
    head = _SECONDS.get(seconds)
    if head is None:
        if len(_SECONDS) > 4096:
            _SECONDS.clear()
        head = _SECONDS[seconds] = datetime.fromtimestamp(seconds, tz=UTC).strftime(
            "%Y-%m-%dT%H:%M:%S"
        )
    return f"{head}.{millis:03d}Z"


def coupon_json(event_id: str, user_id: str, c: Coupon) -> dict[str, Any]:
    return {
        "eventId": event_id,
        "userId": user_id,
        "couponCode": c.code,
        "tier": c.tier,
        "discount": c.discount.to_json(),
        "issuedAt": iso(c.issued_at_ms),
        "expiresAt": iso(c.expires_at_ms),
    }


_REPLAYED_HEADERS = [(b"idempotent-replayed", b"true"), *JSON_HEADERS]


def _problem(status: int, code: str, detail: str, **kwargs: Any) -> Reply:
    return Reply.of_response(problem(status, code, detail, **kwargs))


def outcome_reply(event_id: str, user_id: str, o: Outcome) -> Reply:
    if o.status == "ISSUED":
        body = orjson.dumps(coupon_json(event_id, user_id, o.coupons[0]))
        return Reply.of(201, _REPLAYED_HEADERS if o.replay else JSON_HEADERS, body)
    if o.status == "SOLD_OUT":
        return _problem(410, "SOLD_OUT", f"event {event_id} is sold out")
    if o.status == "DUPLICATE":
        held = [coupon_json(event_id, user_id, c) for c in o.coupons]
        return _problem(
            409,
            "DUPLICATE",
            f"user already holds {len(held)} coupon(s) of event {event_id}, the limit",
            coupon=held[-1],
            coupons=held,
        )
    if o.status == "NOT_STARTED":
        return _problem(
            409, "NOT_STARTED", f"event {event_id} has not started", startAt=iso(o.at_ms or 0)
        )
    if o.status == "ENDED":
        return _problem(409, "ENDED", f"event {event_id} has ended", endAt=iso(o.at_ms or 0))
    if o.status == "PAUSED":
        return _problem(423, "PAUSED", f"event {event_id} is paused", headers={"Retry-After": "5"})
    if o.status == "NOT_FOUND":
        return _problem(404, "EVENT_NOT_FOUND", f"no event {event_id}")
    if o.status == "LIMITED":
        # The gateway answers its own 429 from the allowance header (with RateLimit-*); this
        # body is what a direct caller that asked for an allowance sees.
        retry_us = o.allowance.retry_after_us if o.allowance else 0
        retry = max(1, math.ceil(retry_us / 1_000_000))
        return _problem(
            429,
            "RATE_LIMITED",
            f"too many requests (user limit); retry after {retry}s",
            headers={"Retry-After": str(retry)},
            scope="user",
            retryAfterMs=math.ceil(retry_us / 1000),
        )
    if o.status == "NOT_DURABLE":
        return _problem(
            503,
            "NOT_DURABLE",
            "the coupon was taken but no replica confirmed it in time; retry with the same "
            "Idempotency-Key to receive it",
            headers={"Retry-After": "1"},
        )
    raise AssertionError(f"unmapped outcome {o.status}")


class IssueEdge:
    """ASGI wrapper that serves POST /internal/v1/events/{eventId}/issue itself.

    Why not a Starlette route: this is the one hot endpoint, and Starlette's routing, Request
    object and middleware stack cost more CPU per request than the issuing itself once Redis
    calls are batched. Here the path is split by hand, headers are read in one pass, a known
    sold-out event is answered with a response rendered once, errors are translated through
    the app's own exception table and the RED metrics recorded as REDMiddleware records them
    (flashcoupon_common's error_response and RouteMetrics, shared with the gateway's fast
    path). Everything else falls through to the Starlette app.
    """

    def __init__(self, app: Starlette, *, decide_allowance: bool = True) -> None:
        self.app = app
        # Off: answer presses that carry an allowance as an issuer older than it does
        # (IssuerSettings.decide_allowance).
        self.decide_allowance = decide_allowance
        self._errors = app.exception_handlers
        self._metrics = RouteMetrics("issuer", ISSUE_ROUTE, "POST")
        self._batch_metrics = RouteMetrics("issuer", issue_batch.BATCH_PATH, "POST")
        self._sold_out: dict[str, Reply] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "")
        answer: Reply | Awaitable[Reply]
        if path == issue_batch.BATCH_PATH and scope["type"] == "http" and scope["method"] == "POST":
            # Every press of a batch is run as if it had come alone, at once (their script
            # calls share the batcher's round trips), and answered together; each press counts
            # in the issue route's RED metrics, the batch in its own route's.
            metrics = self._batch_metrics
            answer = self._batch_answer(scope, receive)
        elif scope["type"] == "http" and (event_id := _lone_event(scope)) is not None:
            metrics = self._metrics
            read = self._read_press(scope, event_id)
            answer = read if isinstance(read, Reply) else self._pressed(scope, *read)
        else:
            await self.app(scope, receive, send)
            return
        # Served here rather than in a coroutine of its own, and a lone press's headers read
        # without one: each coroutine a press passes through costs its frame's resumption
        # (docs/issuer.md, "Fewer coroutines per press").
        start = time.perf_counter()
        try:
            reply = answer if isinstance(answer, Reply) else await answer
        except Exception as exc:  # noqa: BLE001 - answered as the app's exception table says
            response = await error_response(self._errors, Request(scope, receive), exc)
            reply = Reply.of_response(response)
        try:
            if not sent_whole(send, reply):  # past uvicorn's two messages when it can
                await reply.send(send)
        finally:
            metrics.record(reply.status, start)

    async def _batch_answer(self, scope: Scope, receive: Receive) -> Reply:
        raw = await _body(receive, issue_batch.MAX_BYTES)
        try:
            presses = issue_batch.decode_presses(raw)
        except issue_batch.BatchError as exc:
            return _problem(400, "MALFORMED_BATCH", str(exc))
        if not self.decide_allowance and any(p.allowance for p in presses):
            return _problem(400, "MALFORMED_BATCH", NO_ALLOWANCE)
        budget = None
        for name, value in scope["headers"]:
            if name == DEADLINE_HEADER:
                budget = deadline_budget(value)
        service: IssueService = scope["state"]["service"]
        start = time.perf_counter()
        answers: list[issue_batch.Answer]
        if tracing.ENABLED:  # each press in its own spans, as a lone press
            answers = [
                *await in_order([self.press(service, *p[:4], budget, p[4]) for p in presses])
            ]
        else:
            answers = await self._batch_answers(service, presses, budget)
        for status, _, _ in answers:
            self._metrics.record(status, start)
        return Reply.of(200, JSON_HEADERS, issue_batch.encode_answers(answers))

    async def _batch_answers(
        self, service: IssueService, presses: list[issue_batch.Press], budget: int | None
    ) -> list[issue_batch.Answer]:
        """Each press's answer, as `press` gives it alone; the valid ones issued together
        (IssueService.issue_many: no task or timer per press)."""
        answers: list[issue_batch.Answer | None] = []
        valid: list[PressArgs] = []
        for p in presses:
            prepared = _prepared(*p)
            if isinstance(prepared, Reply):
                answers.append(prepared)
            else:
                answers.append(None)
                valid.append(prepared)
        outcomes = iter(await service.issue_many(valid, budget))
        for i, (event_id, user, *_) in enumerate(presses):
            if answers[i] is None:
                answers[i] = self._answer(event_id, user, next(outcomes))
        return [a for a in answers if a is not None]  # each press has its answer by now

    def direct_answer(self, scope: Scope) -> Reply | Later | None:
        """A lone press answered by the server the moment its head is read
        (flashcoupon_common.httpserver.DirectAnswer): a 400 or an outcome decided here at once,
        anything else once its script call is done (a Later, from the call's done callback) —
        the answers `__call__` gives, without uvicorn's cycle, task or ASGI call. None (the
        ASGI path) with tracing on, for anything but a lone press, and while the event's
        holders are not loaded."""
        event_id = None if tracing.ENABLED else _lone_event(scope)
        service: IssueService | None = scope["state"].get("service")
        if event_id is None or service is None:
            return None
        start = time.perf_counter()
        read = self._read_press(scope, event_id)
        if isinstance(read, Reply):
            self._metrics.record(read.status, start)
            return read
        press, budget = read
        event_id, user, rid, tp, keyed, allowance = press
        seconds = service.seconds_for(budget)
        started = service.start(
            event_id, user, rid, tp, keyed=keyed, seconds=seconds, allowance=allowance
        )
        if started is None:
            return None
        if isinstance(started, Outcome):
            reply = self._answer(event_id, user, started)
            self._metrics.record(reply.status, start)
            return reply
        # As `issue`'s timeout: the batcher stops retrying at the deadline, this also bounds a
        # call already on the wire.
        timer = (
            None
            if budget is None
            else asyncio.get_running_loop().call_later(seconds, started.cancel)
        )
        return Later(
            started, functools.partial(self._settled, service, press, seconds, timer, start)
        )

    def _settled(
        self,
        service: IssueService,
        press: PressArgs,
        seconds: float,
        timer: asyncio.TimerHandle | None,
        start: float,
        call: asyncio.Future[list[Any]],
    ) -> Reply:
        """A direct answer's reply once its script call is done (raises as `press` would)."""
        if timer is not None:
            timer.cancel()
        event_id, user, rid, _, keyed, _ = press
        status = 500  # what the server answers should this raise
        try:
            outcome = service.settle(call, event_id, user, rid, keyed, seconds)
            reply = self._answer(event_id, user, outcome)
            status = reply.status
            return reply
        finally:
            self._metrics.record(status, start)

    def _read_press(self, scope: Scope, event_id: str) -> Reply | tuple[PressArgs, int | None]:
        """A press sent alone, read from its headers: a 400 for malformed ones, else the press
        as IssueService takes it and the caller's budget (X-Flashcoupon-Deadline-Ms)."""
        user = key = tp = None
        budget: int | None = None
        allowance: AllowanceLimit = None
        raw_user = b""
        for name, value in scope["headers"]:
            if name == b"x-flashcoupon-user":
                raw_user = value
                user = user_from_header(value)
            elif name == _ALLOWANCE_LIMIT and self.decide_allowance:
                allowance = issue_batch.allowance_limit(value.decode("latin-1"))
                if allowance is None:
                    return _problem(
                        400,
                        "MALFORMED_ALLOWANCE",
                        f"{issue_batch.ALLOWANCE_LIMIT_HEADER} must be '<intervalUs> <burst>', "
                        "both > 0",
                    )
            elif name == b"idempotency-key":
                key = value.decode("latin-1")
            elif name == b"traceparent":
                tp = value.decode("latin-1")
            elif name == DEADLINE_HEADER:
                budget = deadline_budget(value)
        if raw_user and user is None:
            return _problem(400, "INVALID_USER", "X-Flashcoupon-User must be UTF-8")
        prepared = _prepared(event_id, user, key, tp, allowance)
        return prepared if isinstance(prepared, Reply) else (prepared, budget)

    async def press(
        self,
        service: IssueService,
        event_id: str,
        user: str | None,
        key: str | None,
        tp: str | None,
        budget: int | None,
        allowance: AllowanceLimit = None,
    ) -> Reply:
        """One shopper's press in a batch with tracing on."""
        prepared = _prepared(event_id, user, key, tp, allowance)
        if isinstance(prepared, Reply):
            return prepared
        return await self._issued(service, prepared, budget)

    def _pressed(self, scope: Scope, press: PressArgs, budget: int | None) -> Awaitable[Reply]:
        return self._issued(scope["state"]["service"], press, budget)

    async def _issued(self, service: IssueService, press: PressArgs, budget: int | None) -> Reply:
        if tracing.ENABLED:
            return await self._traced(service, press, budget)
        event_id, user, rid, tp, keyed, allowance = press
        outcome = await service.issue(
            event_id, user, rid, tp, keyed=keyed, budget_ms=budget, allowance=allowance
        )
        return self._answer(event_id, user, outcome)

    async def _traced(self, service: IssueService, press: PressArgs, budget: int | None) -> Reply:
        """The issue inside a server span (a child of the gateway's) with one child span
        around the script call; the outbox entry records the server span as its parent."""
        event_id, user, rid, tp, keyed, allowance = press
        attributes = {"http.route": ISSUE_ROUTE, "flashcoupon.event_id": event_id}
        with tracing.span(
            SPAN_NAME, tp or None, kind=tracing.SERVER, attributes=attributes
        ) as server:
            with tracing.span(SCRIPT_SPAN, attributes={"db.system": "redis"}) as script:
                outcome = await service.issue(
                    event_id,
                    user,
                    rid,
                    tracing.traceparent_of(server),
                    keyed=keyed,
                    budget_ms=budget,
                    allowance=allowance,
                )
                status = "UNAVAILABLE" if isinstance(outcome, IssuerUnavailable) else outcome.status
                script.set_attribute("flashcoupon.outcome", status)
            reply = self._answer(event_id, user, outcome)
            server.set_attribute("http.response.status_code", reply.status)
            logger.debug("issue %s: %s", event_id, status)
            return reply

    def _answer(self, event_id: str, user: str, outcome: Outcome | IssuerUnavailable) -> Reply:
        """The answer to a press's outcome: a 503 when Redis could not be used."""
        if isinstance(outcome, IssuerUnavailable):
            logger.warning("issue for %s unavailable: %s", event_id, outcome)
            return self._respond(event_id, user, None)
        return _with_allowance(self._respond(event_id, user, outcome), outcome)

    def _respond(self, event_id: str, user: str, outcome: Outcome | None) -> Reply:
        if outcome is None:
            return _problem(
                503,
                "SERVICE_UNAVAILABLE",
                "coupon store unreachable; retry: if a coupon was issued to you, the retry "
                "returns it",
                headers={"Retry-After": "1"},
            )
        if outcome.status == "SOLD_OUT":
            # The common answer after the first seconds: the same for everyone, rendered once
            # (a Reply holds no per-request state and can be sent again).
            sold_out = self._sold_out.get(event_id)
            if sold_out is None:
                if len(self._sold_out) >= 256:  # only sold-out events, but bounded over time
                    self._sold_out.clear()
                sold_out = self._sold_out[event_id] = outcome_reply(event_id, user, outcome)
            return sold_out
        return outcome_reply(event_id, user, outcome)


def _lone_event(scope: Scope) -> str | None:
    """The event id of a lone press (POST /internal/v1/events/{eventId}/issue), else None."""
    path: str = scope["path"]
    if scope["method"] == "POST" and path.startswith(ISSUE_PREFIX) and path.endswith(ISSUE_SUFFIX):
        return path[len(ISSUE_PREFIX) : -len(ISSUE_SUFFIX)]
    return None


def _prepared(
    event_id: str, user: str | None, key: str | None, tp: str | None, allowance: AllowanceLimit
) -> Reply | PressArgs:
    """A 400 for malformed input, or the press as IssueService takes it: a request id made
    for a press without a key, a malformed trace context dropped (not an error: W3C)."""
    refused = _check(event_id, user, key)
    if refused is not None:
        return refused
    assert user is not None
    if tp and not TRACEPARENT_RE.fullmatch(tp):
        tp = None
    return event_id, user, key or os.urandom(10).hex(), tp or "", key is not None, allowance


def _allowance_header(outcome: Outcome | None) -> tuple[bytes, bytes] | None:
    """X-Flashcoupon-Allowance for an outcome whose allowance the script decided."""
    if outcome is None or outcome.allowance is None:
        return None
    value = issue_batch.format_allowance(*outcome.allowance)
    return _ALLOWANCE, value.encode("latin-1")


def _with_allowance(reply: Reply, outcome: Outcome | None) -> Reply:
    """A press's answer with the allowance header, if any (a copy: the sold-out answer is
    shared)."""
    header = _allowance_header(outcome)
    if header is None:
        return reply
    return Reply(reply.status, [*reply.headers, header], reply.body)


async def _body(receive: Receive, max_bytes: int) -> bytes:
    """The request body, or 413 once it grows past `max_bytes`."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_bytes:
            raise ProblemError(413, "PAYLOAD_TOO_LARGE", f"body larger than {max_bytes} bytes")
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _check(event_id: str, user: str | None, key: str | None) -> Reply | None:
    """A 400 problem for malformed input, or None."""
    try:
        validation.event_id(event_id)
        validation.idempotency_key(key)
    except ProblemError as exc:
        return _problem(exc.status, exc.code, exc.detail)
    if not user:
        return _problem(400, "MISSING_USER", "header X-Flashcoupon-User is required")
    if len(user) > MAX_USER_LEN or not user.isprintable():
        return _problem(
            400, "INVALID_USER", f"X-Flashcoupon-User must be printable, max {MAX_USER_LEN} chars"
        )
    return None


async def event_status(request: Request) -> Response:
    event_id = validation.event_id(request.path_params["eventId"])
    redis = request.state.redis
    state, (seconds, micros) = await asyncio.gather(
        event_state.read_state(redis, event_id), redis.time()
    )
    if state is None:
        raise ProblemError(404, "EVENT_NOT_FOUND", f"no event {event_id}")
    # The phase by Redis's clock, as issue.lua decides activation: this host's may be off.
    now = event_state.from_ms(int(seconds) * 1000 + int(micros) // 1000)
    return JSONResponse(
        {
            "eventId": event_id,
            "phase": state.phase(now),
            "paused": state.paused,
            "startAt": iso(event_state.to_ms(state.start_at)),
            "endAt": iso(event_state.to_ms(state.end_at)),
            "quantity": state.quantity,
            "remaining": state.remaining,
        }
    )


def routes() -> list[Route]:
    """The Starlette routes; the issue endpoint is served by IssueEdge in front of them."""
    return [Route("/v1/events/{eventId}", event_status, methods=["GET"])]
