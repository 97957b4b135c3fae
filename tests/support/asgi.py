"""Apps in-process, their lifespan really running: asgi-lifespan's LifespanManager runs
start-up and shutdown, httpx.ASGITransport carries requests (STYLE.md habit 4).

The one subtle part is the lifespan state: LifespanManager hands the same dict to every
request, whereas the ASGI spec (and uvicorn) give each request a shallow copy, so that a
handler writing `request.state.x` cannot leak into the next request. `running` copies it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from asgi_lifespan import LifespanManager
from starlette.types import ASGIApp, Receive, Scope, Send

# Start-up connects to the real stack (Redis Cluster discovery, Kafka metadata): on two busy
# shared cores that takes more than LifespanManager's default 5 s now and then.
STARTUP_TIMEOUT_S = 60
SHUTDOWN_TIMEOUT_S = 30


class LiveApp:
    """An ASGI app whose lifespan is running; `state` is what its lifespan yielded."""

    def __init__(self, app: ASGIApp, state: dict[str, Any]) -> None:
        self._app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)


@asynccontextmanager
async def running(app: ASGIApp) -> AsyncIterator[LiveApp]:
    """Run the app's lifespan (start-up on enter, shutdown on exit); yield the live app."""
    captured: dict[str, dict[str, Any]] = {}

    async def per_request_state(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            captured["state"] = scope["state"]
        else:
            scope = {**scope, "state": dict(scope["state"])}
        await app(scope, receive, send)

    async with LifespanManager(
        per_request_state, startup_timeout=STARTUP_TIMEOUT_S, shutdown_timeout=SHUTDOWN_TIMEOUT_S
    ) as manager:
        yield LiveApp(manager.app, captured["state"])


def client(
    app: ASGIApp, base_url: str = "http://test", *, raise_app_exceptions: bool = True, **kw: Any
) -> httpx.AsyncClient:
    """An httpx client whose requests go straight into `app` (no socket). Without `running`,
    no lifespan runs: enough for routes that need no client (nothing connects)."""
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=raise_app_exceptions)
    return httpx.AsyncClient(transport=transport, base_url=base_url, **kw)


@asynccontextmanager
async def app_client(
    app: ASGIApp, base_url: str = "http://test", **kw: Any
) -> AsyncIterator[httpx.AsyncClient]:
    """`running(app)` plus a client for it: the usual way a test talks to an app."""
    async with running(app) as live, client(live, base_url, **kw) as http:
        yield http
