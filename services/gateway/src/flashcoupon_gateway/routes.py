"""HTTP routes of the public API (the DESIGN.md HTTP contract); thin: parse, call, answer."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import orjson
from flashcoupon_common import validation
from flashcoupon_common.http import (
    JSON_HEADERS,
    Headers,
    JSONResponse,
    ProblemError,
    Reply,
    json_body,
    problem,
)
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from flashcoupon_gateway.ratelimit import rate_headers
from flashcoupon_gateway.service import (
    Gateway,
    Queued,
    checked_code,
    checked_event_id,
    header_value,
    sold_out,
    upstream_headers,
)
from flashcoupon_gateway.upstream import Answer
from flashcoupon_gateway.waiting_room import TicketState

_STATE_NAMES = {
    TicketState.QUEUED: "queued",
    TicketState.READY: "admitted",
    TicketState.ADMITTED: "admitted",
    TicketState.GONE: "gone",
    TicketState.SOLD_OUT: "sold_out",
}


def gw(request: Request) -> Gateway:
    # The lifespan's state, read from the scope: `request.state` makes a State object first.
    return request.scope["state"]["gateway"]  # type: ignore[no-any-return]


def relay(answer: Answer, extra: Headers) -> Reply:
    """The upstream's answer as the shopper gets it, with `extra` headers (RateLimit-*)."""
    return Reply.of(answer.status, [*answer.headers, *extra], answer.body)


def carries_body(request: Request) -> bool:
    """Whether a request comes with a body. Issue takes none; one that is sent must still be
    small, well-formed JSON (json_body)."""
    return header_value(request, b"content-length") not in (None, "0") or (
        header_value(request, b"transfer-encoding") is not None
    )


async def issue_reply(request: Request) -> Reply:
    """The answer to a press: the issue route's, sent as it is by fastpath.IssueFastPath."""
    g = gw(request)
    # Without awaiting unless a JWKS key is needed: each coroutine a press runs through costs
    # its frame (docs/gateway.md, "Fewer coroutines per press").
    authorization = header_value(request, b"authorization")
    principal = g.auth.authenticate_now(authorization) or await g.auth.authenticate(authorization)
    event_id = checked_event_id(request.path_params["eventId"])
    if carries_body(request):
        await json_body(request, max_bytes=g.settings.max_body_bytes)
    headers = upstream_headers(request, principal.user_id)
    result = await g.press(event_id, principal.user_id, g.client_ip(request), headers)
    limits = rate_headers(result.limits)
    if isinstance(result, Queued):
        location = result.body["statusUrl"].encode("latin-1")
        limits += [(b"location", location), *JSON_HEADERS]
        return Reply.of(202, limits, orjson.dumps(result.body))
    return relay(result.answer, limits)


async def issue(request: Request) -> Response:
    return (await issue_reply(request)).response()


async def event_state(request: Request) -> Response:
    g = gw(request)
    event_id = checked_event_id(request.path_params["eventId"])
    outcomes = await g.limiter.check_all([[g.ip_check(g.client_ip(request))]])
    # Public state may be approximate: one upstream read per event every half second at most.
    hit = g.event_cache.get(event_id)
    if hit is not None and time.monotonic() - hit[0] < 0.5:
        return relay(hit[1], rate_headers(outcomes)).response()
    with g.slot():
        up = g.upstream.pick_issuer()
        answer = await g.upstream.call(up, "GET", f"/v1/events/{event_id}", {})
    if answer.status < 500:
        if len(g.event_cache) > 10_000:
            g.event_cache.clear()
        g.event_cache[event_id] = (time.monotonic(), answer)
    return relay(answer, rate_headers(outcomes)).response()


async def my_coupons(request: Request) -> Response:
    g = gw(request)
    principal = await g.principal(request)
    limit = validation.limit(request.query_params.get("limit"))
    checks = g.client_checks(g.client_ip(request), g.api_user_check(principal.user_id))
    outcomes = await g.limiter.check_all([checks])
    headers = upstream_headers(request, principal.user_id)
    with g.slot():
        up = g.upstream.acquire_wallet()
        answer = await g.upstream.call(up, "GET", f"/v1/me/coupons?limit={limit}", headers)
    return relay(answer, rate_headers(outcomes)).response()


async def redeem(request: Request) -> Response:
    g = gw(request)
    principal = await g.principal(request)
    code = checked_code(request.path_params["code"])
    body = await json_body(request, max_bytes=g.settings.max_body_bytes)
    # The wallet checks the same rules; checking here too keeps bad input off the upstream.
    validation.order_id(body)
    validation.order_amount(body)
    checks = g.client_checks(g.client_ip(request), g.api_user_check(principal.user_id))
    outcomes = await g.limiter.check_all([checks])
    headers = {**upstream_headers(request, principal.user_id), "Content-Type": "application/json"}
    with g.slot():
        up = g.upstream.acquire_wallet()
        answer = await g.upstream.call(
            up, "POST", f"/v1/coupons/{code}/redeem", headers, orjson.dumps(body)
        )
    return relay(answer, rate_headers(outcomes)).response()


async def queue_status(request: Request) -> Response:
    g = gw(request)
    principal = await g.principal(request)
    user = principal.user_id
    event_id = checked_event_id(request.path_params["eventId"])
    ticket = request.path_params["ticket"]
    n = g.room.parse(event_id, user, ticket)
    info = await g.specs.get(event_id)
    if info.spec is None or not info.spec.admission.waiting_room_enabled:
        raise ProblemError(404, "NO_WAITING_ROOM", "this event has no waiting room")
    await g.limiter.check_all([[g.ip_check(g.client_ip(request))]])
    rate = float(info.spec.admission.waiting_room_admit_per_second)
    if "text/event-stream" in request.headers.get("accept", ""):
        stream = sse(g, request, event_id, user, n, rate, info.start_ms)
        return StreamingResponse(
            stream,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
    answer = await g.room.status(event_id, user, n, rate, info.start_ms)
    return JSONResponse(
        {
            "ticket": ticket,
            "position": answer.position,
            "etaSeconds": answer.eta_seconds(rate, info.start_ms),
            "state": _STATE_NAMES[answer.state],
        }
    )


def problem_body(exc: ProblemError) -> object:
    """The problem document the shopper would get for `exc` as an HTTP answer."""
    return orjson.loads(problem(exc.status, exc.code, exc.detail, **exc.extra).body)


def _sse(event: str, data: object) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


async def sse(
    g: Gateway, request: Request, event_id: str, user: str, n: int, rate: float, start_ms: int
) -> AsyncIterator[bytes]:
    """Position/ETA until admitted, then the issue done on the shopper's behalf, then close."""
    headers = upstream_headers(request, user)
    last: tuple[int, int] | None = None
    idle = 0.0
    interval = g.settings.sse_interval_seconds
    yield b"retry: 2000\n\n"
    while True:
        await g.specs.get(event_id)  # cached; its refresh also confirms or clears a sell-out
        # Queued tickets read the process's shared cursor; Redis is asked near the front only.
        answer = g.room.cached_position(event_id, n, rate, start_ms) or await g.room.consume(
            event_id, user, n, rate, start_ms
        )
        if answer.state is TicketState.SOLD_OUT:
            yield _sse("result", {"status": 410, "body": problem_body(sold_out(event_id))})
            return
        if answer.state is TicketState.ADMITTED:
            yield _sse("admitted", {"position": 0, "etaSeconds": 0, "state": "admitted"})
            try:
                result = await g.issue(event_id, headers)
                status, body = result.status, orjson.loads(result.body or b"null")
            except ProblemError as exc:
                status, body = exc.status, problem_body(exc)
            except orjson.JSONDecodeError:
                status, body = 502, {"code": "BAD_UPSTREAM", "detail": "unreadable issuer answer"}
            yield _sse("result", {"status": status, "body": body})
            return
        if answer.state is TicketState.GONE:
            yield _sse("gone", {"state": "gone", "detail": "ticket used or expired"})
            return
        eta = answer.eta_seconds(rate, start_ms)
        if (answer.position, eta) != last or idle >= 15:
            last, idle = (answer.position, eta), 0.0
            yield _sse(
                "position", {"position": answer.position, "etaSeconds": eta, "state": "queued"}
            )
        # Poll faster near the front so admission is noticed promptly.
        wait = min(interval, max(0.05, answer.position / rate / 2))
        idle += wait
        await g.room.wait(event_id, wait)  # a sell-out wakes the stream at once


ISSUE_PATH = "/v1/events/{eventId}/issue"
# The issue route is normally served by fastpath.IssueFastPath; the Route stays so that
# OpenAPI, 405s for other methods and any app without the fast path behave the same.
ROUTES = [
    Route(ISSUE_PATH, issue, methods=["POST"]),
    Route("/v1/events/{eventId}", event_state, methods=["GET"]),
    Route("/v1/events/{eventId}/queue/{ticket}", queue_status, methods=["GET"]),
    Route("/v1/me/coupons", my_coupons, methods=["GET"]),
    Route("/v1/coupons/{code}/redeem", redeem, methods=["POST"]),
]
