"""Server-edge pieces without a server: read-timeout settings, disconnects counted as such."""

from __future__ import annotations

import httpx
import pytest
from flashcoupon_common.http import TIMED_OUT, exception_handlers, json_body
from flashcoupon_common.httpserver import ServerTimeouts
from flashcoupon_common.red_metrics import HTTP_REQUESTS, REDMiddleware
from flashcoupon_common.settings import SettingsError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import Message, Scope


def test_timeouts_default_to_ten_seconds_and_refuse_nonsense() -> None:
    assert ServerTimeouts.from_env("P_", {}) == ServerTimeouts(10.0, 10.0)
    got = ServerTimeouts.from_env(
        "P_", {"P_HEADER_TIMEOUT_SECONDS": "3", "P_BODY_TIMEOUT_SECONDS": "4.5"}
    )
    assert got == ServerTimeouts(3.0, 4.5)
    with pytest.raises(SettingsError, match="P_HEADER_TIMEOUT_SECONDS"):
        ServerTimeouts.from_env("P_", {"P_HEADER_TIMEOUT_SECONDS": "0"})
    with pytest.raises(SettingsError, match="P_BODY_TIMEOUT_SECONDS"):
        ServerTimeouts.from_env("P_", {"P_BODY_TIMEOUT_SECONDS": "soon"})


async def echo(request: Request) -> Response:
    return Response(str(await json_body(request)))


def _app() -> Starlette:
    return Starlette(
        routes=[Route("/echo", echo, methods=["POST"])],
        exception_handlers=exception_handlers(),
        middleware=[Middleware(REDMiddleware, service="edge-test")],
    )


def _count(status: str) -> float:
    value = HTTP_REQUESTS.labels("edge-test", "/echo", "POST", status)._value.get()  # type: ignore[attr-defined]
    return float(value)


@pytest.mark.parametrize(("timed_out", "status"), [(False, "499"), (True, "408")])
async def test_a_client_gone_mid_body_is_counted_as_what_it_is(
    timed_out: bool, status: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Not an unhandled error (no traceback, no 500): 499, or 408 at the server's deadline."""
    app = _app()
    sent: list[Message] = []
    messages = [
        {"type": "http.request", "body": b'{"a":', "more_body": True},
        {"type": "http.disconnect"},
    ]

    async def receive() -> Message:
        return messages.pop(0)

    async def send(message: Message) -> None:
        sent.append(message)

    scope: Scope = {
        "type": "http",
        "method": "POST",
        "path": "/echo",
        "raw_path": b"/echo",
        "query_string": b"",
        "headers": [(b"content-length", b"100")],
        "app": app,
    }
    if timed_out:
        scope[TIMED_OUT] = True
    before, errors = _count(status), _count("500")
    await app(scope, receive, send)
    assert _count(status) == before + 1 and _count("500") == errors
    assert sent[0]["status"] == int(status)
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL") or r.exc_info]


async def test_a_whole_body_still_works() -> None:
    transport = httpx.ASGITransport(app=_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        r = await c.post("/echo", content=b'{"a": 1}')
    assert r.status_code == 200 and r.text == "{'a': 1}"
