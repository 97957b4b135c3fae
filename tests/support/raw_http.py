"""A uvicorn server in the test's own loop, and raw HTTP/1.1 bytes exchanged with it.

For the server-edge tests (flashcoupon_common.httpserver), which compare what goes on the wire
byte for byte: `serving` runs an ASGI app on the services' server options, `exchange` writes
requests and reads everything until the server closes the connection.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from flashcoupon_common.httpserver import ServerTimeouts, server_options

from tests.support.polling import wait_until
from tests.support.ports import free_port


@asynccontextmanager
async def serving(app: Any, **options: Any) -> AsyncIterator[tuple[uvicorn.Server, int]]:
    """`app` served on 127.0.0.1 with server_options (overridden by `options`); (server, port)."""
    port = free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, **{**server_options("t", ServerTimeouts()), **options}
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        await wait_until(lambda: server.started, 10, 0.05, what="uvicorn started")
        yield server, port
    finally:
        server.should_exit = True
        await task


async def exchange(port: int, raw: bytes) -> bytes:
    """What the server writes for `raw` until it closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        async with asyncio.timeout(10):
            return await reader.read(-1)
    finally:
        writer.close()
