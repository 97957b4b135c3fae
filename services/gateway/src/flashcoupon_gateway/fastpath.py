"""The hot route, `POST /v1/events/{eventId}/issue`, served without Starlette's per-request layers.

Measured on the development machine, Starlette's routing, exception middleware and RED
middleware cost ~60 µs per request over a bare ASGI callable — a sixth of the gateway's CPU
per forwarded issue. This ASGI wrapper sits outside the Starlette app (create_app returns
it), recognises the issue route by one regex, and calls the same handler (`routes.issue`),
translating errors through the app's own exception table and recording the same RED metrics
under the same route template (flashcoupon_common's error_response and RouteMetrics, which
the issuer's IssueEdge uses too).
Every other request passes through to the full Starlette stack unchanged.

The sold-out lane: once an event is sold out, most presses are answered 410 by this process
(Gateway.check_sold_out). `sold_out_now` takes that decision before any Request object, await
or task switch exists — reading the three headers it needs from the scope — and sends a 410
rendered once per event; anything it cannot decide at once takes the full path, which applies
the same rules. Under uvicorn the server writes the lane's answer itself as the press's head is
read, without a request cycle, task or ASGI call (`direct_answer`, docs/gateway.md "Direct
answers"); `__call__` keeps the lane for any other server. Measured with a distinct token per
shopper, the lane's answers run at ~1.0 of a hello-world on the same server (docs/gateway.md).
Any other body-less press is answered by a task of its own, written by the server when that
task is done (a `Later`): the same answer as through `__call__`, without uvicorn's cycle and
ASGI call around it.
With tracing on (flashcoupon_common.tracing) the route runs inside a server span, a child of
the shopper's traceparent if any; the forwarded request carries that span's traceparent.
"""

from __future__ import annotations

import asyncio
import re
import time

from flashcoupon_common import tracing
from flashcoupon_common.http import Reply, error_response
from flashcoupon_common.httpserver import Later, sent_whole
from flashcoupon_common.red_metrics import RouteMetrics
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.types import Message, Receive, Scope, Send

from flashcoupon_gateway.routes import ISSUE_PATH, issue_reply
from flashcoupon_gateway.service import Gateway

_ISSUE = re.compile(r"^/v1/events/([^/]+)/issue$")
SPAN_NAME = f"POST {ISSUE_PATH}"


def sold_out_now(scope: Scope, event_id: str) -> Reply | None:
    """The prebuilt 410 when this press is answered SOLD_OUT without awaiting; else None.

    Only a press without a body qualifies (one with a body is checked on the full path), and
    only once the lifespan has built the gateway."""
    gateway: Gateway | None = scope.get("state", {}).get("gateway")
    if gateway is None or not gateway.sold_out.is_sold_out(event_id):
        return None  # before reading the headers: most presses of a drop's first seconds
    authorization = None
    for name, value in scope["headers"]:
        if name == b"authorization" and authorization is None:  # the first, as Starlette's
            authorization = value.decode("latin-1")
        elif _frames_a_body(name, value):
            return None
    if gateway.answers_sold_out_now(event_id, authorization):
        return gateway.sold_out_answer(event_id)
    return None


def _frames_a_body(name: bytes, value: bytes) -> bool:
    """Whether this header says its request has a body (which the full path reads)."""
    return (name == b"content-length" and value != b"0") or name == b"transfer-encoding"


def _bodyless(scope: Scope) -> bool:
    """Whether a request's head says it has no body."""
    return not any(_frames_a_body(name, value) for name, value in scope["headers"])


async def _no_body() -> Message:
    """The `receive` of a body-less press answered directly (nothing else is read from it)."""
    return {"type": "http.request", "body": b"", "more_body": False}


def _task_reply(answering: asyncio.Future[Reply]) -> Reply:
    return answering.result()


# Where direct_answer leaves the event id of a press it matched and left to the ASGI path.
_LANE_TRIED = "flashcoupon.lane_tried"


def _pressed_event(scope: Scope) -> str | None:
    """The event id of a POST to the issue route; None for any other request."""
    match = _ISSUE.fullmatch(scope["path"]) if scope["method"] == "POST" else None
    return None if match is None else match.group(1)


class IssueFastPath:
    def __init__(self, app: Starlette, service: str = "gateway") -> None:
        self.app = app
        self._errors = app.exception_handlers
        self._metrics = RouteMetrics(service, ISSUE_PATH, "POST")
        # The presses answered by tasks of their own (direct_answer): the event loop holds a
        # task only weakly, so they are held here until done, as uvicorn holds its own.
        self._answering: set[asyncio.Task[Reply]] = set()

    def direct_answer(self, scope: Scope) -> Reply | Later | None:
        """A press answered by the server the moment its head is read
        (flashcoupon_common.httpserver.DirectAnswer): the sold-out lane's 410 at once, any
        other body-less press from a task of its own once it is done (a Later); None for a
        press with a body (its body is read on the ASGI path) and anything else, which
        `__call__` then answers. A press left to `__call__` is marked as such in its scope, so
        it neither matches the route nor tries the lane again."""
        event_id = None if tracing.ENABLED else _pressed_event(scope)
        if event_id is None:
            return None
        start = time.perf_counter()
        sold_out = sold_out_now(scope, event_id)
        if sold_out is not None:
            self._metrics.record(sold_out.status, start)
            return sold_out
        if not _bodyless(scope):
            scope[_LANE_TRIED] = event_id
            return None
        scope["path_params"] = {"eventId": event_id}
        answering = asyncio.get_running_loop().create_task(
            self._answered(Request(scope, _no_body), start)
        )
        self._answering.add(answering)
        answering.add_done_callback(self._answering.discard)
        return Later(answering, _task_reply)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        tried: str | None = scope.get(_LANE_TRIED)
        event_id = tried or (_pressed_event(scope) if scope["type"] == "http" else None)
        if event_id is None:
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        # With tracing on, every press runs in its span: the lane is skipped. Under uvicorn the
        # lane was tried as the head was read (direct_answer); this is the lane for other servers.
        sold_out = None if tried is not None or tracing.ENABLED else sold_out_now(scope, event_id)
        if sold_out is None:
            scope["path_params"] = {"eventId": event_id}
            request = Request(scope, receive)
            if tracing.ENABLED:
                reply = await self._traced(request, event_id)
            else:
                try:  # _answer's, inline: a coroutine less for each press to resume through
                    reply = await issue_reply(request)
                except Exception as exc:  # noqa: BLE001 - as _answer
                    reply = Reply.of_response(await error_response(self._errors, request, exc))
        else:
            reply = sold_out
        try:
            if not sent_whole(send, reply):  # past uvicorn's two messages when it can
                await reply.send(send)
        finally:
            self._metrics.record(reply.status, start)

    async def _answered(self, request: Request, start: float) -> Reply:
        """`_answer`, counted in the route's metrics (a Later's: the server writes it)."""
        reply = await self._answer(request)
        self._metrics.record(reply.status, start)
        return reply

    async def _answer(self, request: Request) -> Reply:
        """The press's answer, or the app's exception table's answer to its error."""
        try:
            return await issue_reply(request)
        except Exception as exc:  # noqa: BLE001 - answered as the app's exception table says
            return Reply.of_response(await error_response(self._errors, request, exc))

    async def _traced(self, request: Request, event_id: str) -> Reply:
        headers = request.headers
        with tracing.span(
            SPAN_NAME,
            headers.get("traceparent"),
            tracestate=headers.get("tracestate"),
            kind=tracing.SERVER,
            attributes={"http.request.method": "POST", "http.route": ISSUE_PATH},
        ) as span:
            reply = await self._answer(request)
            span.set_attribute("flashcoupon.event_id", event_id[:64])
            span.set_attribute("http.response.status_code", reply.status)
            return reply
