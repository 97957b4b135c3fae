"""The driver survives a real server closing idle keep-alive connections (uvicorn: 5 s).

A burst's connections are opened before startAt and may sit idle longer than the server's
keep-alive timeout; the first request on such a connection must still get its answer. The
hello-world is served with the issuer's server options (uvicorn's default 5 s keep-alive; the
gateway's, which the benchmarks' hello-world gets, keep connections for 30 s).
"""

from __future__ import annotations

import asyncio
import subprocess

from flashcoupon_loadtest.benchkit import HELLO_APP
from flashcoupon_loadtest.http1 import Connection, Target, build_request
from flashcoupon_loadtest.localrun import free_port, wait_ready
from flashcoupon_loadtest.serve import server_command


def start_hello(port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(server_command(HELLO_APP, port, service="issuer"))


async def test_request_after_the_server_dropped_the_idle_connection() -> None:
    port = free_port()
    server = start_hello(port)
    try:
        await asyncio.to_thread(wait_ready, f"http://127.0.0.1:{port}/readyz", timeout=30)
        target = Target.parse(f"http://127.0.0.1:{port}")
        conn = Connection(target)
        raw = build_request(target, "GET", "/")
        assert (await conn.request(raw))[0] == 200
        await asyncio.sleep(6.5)  # past uvicorn's 5 s keep-alive timeout: the server closed it
        status, _, body = await conn.request(raw)
        assert (status, body) == (200, b"hello")
        conn.close()
    finally:
        server.terminate()
        server.wait(timeout=10)
