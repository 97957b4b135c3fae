"""Per-request CPU of the HTTP/1.1 clients, before and after the shared wire (printed ratio).

    uv run pytest loadtest/pool_ab_bench.py -s -q -p no:cacheprovider

(A one-off A/B of the change that introduced flashcoupon_common.http1: it reads the old code
from git. Kept beside the load driver, outside the package and outside make test.)

The gateway pool and the load driver's connection, each as of FLASHCOUPON_BENCH_POOL_BASE (a
git revision, default 8f0dcf4: before flashcoupon_common.http1) and as in the work tree, make
FLASHCOUPON_BENCH_POOL_N (default 20000) request/response exchanges against a tiny asyncio
server. The server is its own process, so this process's CPU time (time.process_time) is the
clients' alone; the clients take turns in blocks, the order reversed every block, so the
machine's load and warm caches favour none.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import subprocess
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest
from flashcoupon_common import http1
from flashcoupon_gateway import pool as new_pool
from flashcoupon_loadtest import http1 as new_driver

ROOT = Path(__file__).resolve().parents[1]
BASE = os.environ.get("FLASHCOUPON_BENCH_POOL_BASE", "8f0dcf4")
N = int(os.environ.get("FLASHCOUPON_BENCH_POOL_N", "20000"))
BLOCKS = 10
CONCURRENCY = 4

ANSWER = (  # an issuer-sized 201, as uvicorn frames it
    b"HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: 50\r\n"
    b"date: Mon, 23 Nov 2026 20:00:00 GMT\r\nserver: uvicorn\r\n\r\n"
    + b'{"couponCode":"AB12CD34EF","tier":"big","x":"pad"}'[:50]
)
# Answers every request (head plus Content-Length body) with ANSWER, keep-alive.
SERVER = rf"""
import asyncio
ANSWER = {ANSWER!r}
async def serve(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            i = head.lower().find(b"content-length:")
            if i >= 0:
                await reader.readexactly(int(head[i + 15 : head.index(b"\r\n", i)]))
            writer.write(ANSWER)
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()
async def main():
    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()
asyncio.run(main())
"""

HEADERS = {
    "X-Flashcoupon-User": "user-12345",
    "X-Request-Id": "3f0c1d2e-aaaa-bbbb-cccc-0123456789ab",
    "Idempotency-Key": "k-0123456789abcdef",
    "X-Flashcoupon-Deadline-Ms": "800",
}
BODY = b'{"tier":"any"}'


def _module_at(rev: str, path: str, name: str) -> ModuleType:
    source = subprocess.run(
        ["git", "show", f"{rev}:{path}"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    spec = importlib.util.spec_from_loader(name, loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    exec(compile(source, f"{rev}:{path}", "exec"), module.__dict__)
    return module


async def _cpu_per_request(
    run: dict[str, Callable[[int], Awaitable[None]]],
) -> dict[str, float]:
    """CPU seconds per request for each client, measured in alternating blocks."""
    spent = dict.fromkeys(run, 0.0)
    for name in run:
        await run[name](200)  # warm: connections open, caches filled
    order = list(run.items())
    for _ in range(BLOCKS):
        order.reverse()  # ABBA...: neither client always runs right after the other
        for name, go in order:
            start = time.process_time()
            await go(N // BLOCKS)
            spent[name] += time.process_time() - start
    return {name: total / N for name, total in spent.items()}


def _pool_runner(module: ModuleType, port: int) -> Callable[[int], Awaitable[None]]:
    pool = module.HTTPPool(f"http://127.0.0.1:{port}", max_connections=CONCURRENCY)

    async def worker(count: int) -> None:
        for _ in range(count):
            answer = await pool.request(
                "POST", "/internal/v1/events/ev/issue", HEADERS, BODY, deadline_seconds=5
            )
            assert answer[0] == 201

    async def go(n: int) -> None:
        await asyncio.gather(*(worker(n // CONCURRENCY) for _ in range(CONCURRENCY)))

    return go


def _driver_runner(module: ModuleType, port: int) -> Callable[[int], Awaitable[None]]:
    target = module.Target.parse(f"http://127.0.0.1:{port}")
    raw = module.build_request(target, "POST", "/v1/events/ev/issue", HEADERS, BODY)
    conns = [module.Connection(target) for _ in range(CONCURRENCY)]

    async def worker(conn: object, count: int) -> None:
        for _ in range(count):
            assert (await conn.request(raw))[0] == 201  # type: ignore[attr-defined]

    async def go(n: int) -> None:
        await asyncio.gather(*(worker(c, n // CONCURRENCY) for c in conns))

    return go


@pytest.fixture
def server_port() -> Iterator[int]:
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        yield int(server.stdout.readline())
    finally:
        server.terminate()
        server.wait()


async def test_shared_wire_costs_no_more_cpu_per_request(server_port: int) -> None:
    old_pool = _module_at(BASE, "services/gateway/src/flashcoupon_gateway/pool.py", "_old_pool")
    old_driver = _module_at(BASE, "loadtest/src/flashcoupon_loadtest/http1.py", "_old_http1")
    per_request = await _cpu_per_request(
        {
            "pool old": _pool_runner(old_pool, server_port),
            "pool new": _pool_runner(new_pool, server_port),
            "driver old": _driver_runner(old_driver, server_port),
            "driver new": _driver_runner(new_driver, server_port),
        }
    )
    print(f"\n{N} exchanges each, {CONCURRENCY} concurrent, baseline {BASE}")
    for name, seconds in per_request.items():
        print(f"  {name:<10} {seconds * 1e6:7.1f} µs CPU/request")
    for client in ("pool", "driver"):
        ratio = per_request[f"{client} new"] / per_request[f"{client} old"]
        print(f"  {client}: new/old = {ratio:.3f}")


class _Loopback:
    """A writer whose every request is answered at once into the reader: no socket, no loop
    wake-ups, so only the code that builds requests and parses answers is timed."""

    def __init__(self, reader: asyncio.StreamReader, answer: bytes) -> None:
        self.reader = reader
        self.answer = answer

    def write(self, data: bytes) -> None:
        self.reader.feed_data(self.answer)

    def close(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False


async def test_wire_alone_costs_no_more_cpu_per_request() -> None:
    old_pool = _module_at(BASE, "services/gateway/src/flashcoupon_gateway/pool.py", "_old_pool")
    reader = asyncio.StreamReader(limit=1 << 20)
    loopback = _Loopback(reader, ANSWER)
    path = "/internal/v1/events/ev/issue"
    old_conn = old_pool._Conn(reader, loopback, 0.0)
    exchange = old_pool.HTTPPool("http://issuer:8081")._exchange  # idles the conn: one list
    new_conn = new_pool._Pooled(reader, loopback)  # type: ignore[arg-type]
    idle: deque[new_pool._Pooled] = deque()

    async def old(n: int) -> None:
        for _ in range(n):
            raw = old_pool.request_head("POST", path, "issuer:8081", HEADERS)
            raw += b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY
            assert (await exchange(old_conn, raw))[0] == 201

    async def new(n: int) -> None:
        for _ in range(n):
            raw = http1.build_request("POST", path, "issuer:8081", HEADERS, BODY)
            assert (await new_conn.exchange(raw))[0] == 201
            if new_conn.open:  # what the pool does with the connection afterwards
                new_conn.idle_since = time.monotonic()
                idle.append(new_conn)

    per_request = await _cpu_per_request({"wire old": old, "wire new": new})
    print(f"\nrequest bytes + answer parsing, {N} each, baseline {BASE}")
    for name, seconds in per_request.items():
        print(f"  {name:<10} {seconds * 1e6:7.2f} µs CPU/request")
    print(f"  wire: new/old = {per_request['wire new'] / per_request['wire old']:.3f}")
