"""HTTP pieces every service shares: problem+json errors, health/readiness/metrics routes.

Errors follow RFC 9457 with a stable machine `code`. Domain code raises `ProblemError` (or a
subclass); `exception_handlers()` turns it, Starlette's HTTPException (404, 405, ...) and any
unexpected exception into problem+json, so no client ever sees a stack trace. A client that
goes away mid-request (Starlette's ClientDisconnect) is neither: it is counted as 499, or as
408 when the server's read deadline cut it off (httpserver.py), and not logged as an error.

The internal user header (`X-Flashcoupon-User`, set only by the gateway) carries the user id
as UTF-8 bytes, byte-exact: the gateway's upstream pool encodes header values as UTF-8, and
`user_from_header` is the receiving end. ASCII ids are the same bytes as before; a Latin-1
encoded id (from an older gateway) is not valid UTF-8 and is refused, never stored mangled.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, NamedTuple

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Send

from flashcoupon_common.problems import ProblemError as ProblemError

logger = logging.getLogger(__name__)

PROBLEM_JSON = "application/problem+json"
USER_HEADER = "X-Flashcoupon-User"
# Set in an ASGI scope by the server when it cut the request off at its read deadline.
TIMED_OUT = "flashcoupon.timed_out"
# nginx's "client closed request": what a request whose client went away is counted as.
CLIENT_CLOSED = 499

# Stable codes for the errors the framework raises before our handlers run.
_HTTP_CODES = {
    400: "BAD_REQUEST",
    401: "UNAUTHORIZED",
    403: "FORBIDDEN",
    404: "NOT_FOUND",
    405: "METHOD_NOT_ALLOWED",
    413: "PAYLOAD_TOO_LARGE",
    415: "UNSUPPORTED_MEDIA_TYPE",
    422: "UNPROCESSABLE",
    429: "RATE_LIMITED",
    503: "SERVICE_UNAVAILABLE",
}


# And 1xx: statuses sent without a body or Content-Length (Starlette; httpserver.sent_whole).
NO_BODY = frozenset({204, 304})


Headers = list[tuple[bytes, bytes]]  # as ASGI messages carry them: lower-case names, Latin-1
JSON_HEADERS: Headers = [(b"content-type", b"application/json")]  # shared: never appended to


class Reply(NamedTuple):
    """An answer as the ASGI messages carry it: the hot routes (the gateway's issue) send one
    without a Starlette `Response`, whose init and `__call__` cost ~2 µs per answer more.
    `response()` is the same answer for a Starlette route."""

    status: int
    headers: Headers  # Content-Length included
    body: bytes

    @classmethod
    def of(cls, status: int, headers: Headers, body: bytes) -> Reply:
        """`headers` (without a Content-Length) and the Content-Length Starlette's `Response`
        would add for `body`: none for a body-less status (1xx, 204, 304)."""
        if status >= 200 and status not in NO_BODY:
            headers = [*headers, (b"content-length", b"%d" % len(body))]
        return cls(status, headers, body)

    @classmethod
    def of_response(cls, response: Response) -> Reply:
        """A rendered `Response` (no background task: an error handler's problem) as a Reply."""
        return cls(response.status_code, response.raw_headers, bytes(response.body))

    async def send(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status, "headers": self.headers})
        await send({"type": "http.response.body", "body": self.body})

    def response(self) -> Response:
        return _ReplyResponse(self)


class _ReplyResponse(Response):
    """A Reply as a Starlette Response: its head exactly as given (Response's init_headers
    would add its own Content-Length)."""

    def __init__(self, reply: Reply) -> None:
        self.status_code = reply.status
        self.background = None
        self.body = reply.body
        self.raw_headers = reply.headers


class JSONResponse(Response):
    media_type = "application/json"

    def __init__(
        self,
        content: Any,
        status_code: int = 200,
        headers: Mapping[str, str] | None = None,
        media_type: str | None = None,
        background: Any = None,
    ) -> None:
        if headers or media_type or background or status_code in NO_BODY or status_code < 200:
            super().__init__(content, status_code, headers, media_type, background)
            return
        # The common answer (a coupon, an event) has no headers of its own: its two headers
        # are set here as Starlette's init_headers would set them, for half its cost.
        self.status_code = status_code
        self.background = None
        self.body = orjson.dumps(content)
        self.raw_headers = [
            (b"content-length", str(len(self.body)).encode()),
            (b"content-type", b"application/json"),
        ]

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content)


def problem_body(status: int, code: str, detail: str, **extra: Any) -> bytes:
    return orjson.dumps(
        {
            "type": f"https://flashcoupon.io/problems/{code.lower().replace('_', '-')}",
            "title": code.replace("_", " ").capitalize(),
            "status": status,
            "code": code,
            "detail": detail,
            **extra,
        }
    )


def problem(
    status: int,
    code: str,
    detail: str,
    *,
    headers: Mapping[str, str] | None = None,
    **extra: Any,
) -> Response:
    body = problem_body(status, code, detail, **extra)
    return Response(body, status, headers=dict(headers or {}), media_type=PROBLEM_JSON)


def disconnected(scope: Mapping[str, Any]) -> Response:
    """The 'answer' to a request whose client is gone: never delivered, only counted."""
    return Response(status_code=408 if scope.get(TIMED_OUT) else CLIENT_CLOSED)


def user_from_header(value: bytes | str) -> str | None:
    """The user id an X-Flashcoupon-User value carries, or None if it is not UTF-8.

    A str is what Starlette's `request.headers` gives: the raw bytes decoded as Latin-1,
    which `encode("latin-1")` turns back into exactly those bytes.
    """
    raw = value.encode("latin-1") if isinstance(value, str) else value
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return None


async def _on_problem(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ProblemError)
    return problem(exc.status, exc.code, exc.detail, headers=exc.headers, **exc.extra)


async def _on_http(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = _HTTP_CODES.get(exc.status_code, "HTTP_ERROR")
    return problem(exc.status_code, code, str(exc.detail), headers=exc.headers)


async def _on_disconnect(request: Request, exc: Exception) -> Response:
    return disconnected(request.scope)


async def _on_unexpected(request: Request, exc: Exception) -> Response:
    # Deliberately absorbed: the client gets a problem document, the log gets the trace.
    logger.exception("unhandled error on %s %s", request.method, request.url.path)
    return problem(500, "INTERNAL", "internal error; it has been logged")


ExceptionTable = dict[Any, Callable[[Request, Exception], Awaitable[Response]]]


def exception_handlers() -> ExceptionTable:
    """The shared exception table: an app adds its own entries (e.g. store errors → 503)."""
    return {
        ProblemError: _on_problem,
        HTTPException: _on_http,
        ClientDisconnect: _on_disconnect,
        Exception: _on_unexpected,
    }


async def error_response(table: ExceptionTable, request: Request, exc: Exception) -> Response:
    """The answer `table` gives for `exc`, found as Starlette finds it (the nearest class in
    the exception's MRO): hot routes served outside Starlette translate errors exactly as the
    app's exception handlers do."""
    for cls in type(exc).__mro__:
        handler = table.get(cls)
        if handler is not None:
            return await handler(request, exc)
    raise exc


async def json_body(request: Request, *, max_bytes: int = 16_384) -> dict[str, Any]:
    """The request's JSON object body, or a 4xx ProblemError saying what is wrong."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise ProblemError(413, "PAYLOAD_TOO_LARGE", f"body larger than {max_bytes} bytes")
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > max_bytes:
            raise ProblemError(413, "PAYLOAD_TOO_LARGE", f"body larger than {max_bytes} bytes")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise ProblemError(400, "MALFORMED_JSON", "request body is not valid JSON") from None
    if not isinstance(body, dict):
        raise ProblemError(400, "MALFORMED_JSON", "request body must be a JSON object")
    return body


ReadyCheck = Callable[[], Awaitable[Mapping[str, bool]]]


def health_routes(ready: ReadyCheck, registry: CollectorRegistry = REGISTRY) -> list[Route]:
    """/healthz (the process answers), /readyz (dependencies reachable), /metrics."""

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        try:
            checks = dict(await ready())
        except Exception as exc:  # noqa: BLE001 - any failure means "not ready", with the reason
            return JSONResponse({"status": "unready", "error": repr(exc)}, 503)
        ok = all(checks.values())
        return JSONResponse(
            {"status": "ok" if ok else "unready", "checks": checks}, 200 if ok else 503
        )

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    return [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
