"""A hello-world Starlette app: the target the driver's self-test measures itself against."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route


async def hello(request: Request) -> Response:
    return PlainTextResponse("hello")


app = Starlette(routes=[Route("/", hello), Route("/readyz", hello)])
