"""A hello-world Starlette app: the baseline the driver and the services are measured against.

It answers 200 "hello" to GET or POST of any path, so a benchmark can send it the very requests
it sends a service (the demo's issue presses: JWT, X-Forwarded-For, Idempotency-Key) and the
baseline differs from the service only in what the application does.
"""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route


async def hello(request: Request) -> Response:
    return PlainTextResponse("hello")


app = Starlette(routes=[Route("/{path:path}", hello, methods=["GET", "POST"])])
