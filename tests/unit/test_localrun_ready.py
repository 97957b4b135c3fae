"""localrun.wait_ready's `times`: every one of N connections in a row must be answered."""

from __future__ import annotations

import http.server
import itertools
import threading
from collections.abc import Iterator

import pytest
from flashcoupon_loadtest import localrun


@pytest.fixture
def flaky_url() -> Iterator[str]:
    """A server that refuses every fourth request (503), as a balancer with one bad way."""
    count = itertools.count(1)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(503 if next(count) % 4 == 0 else 200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/readyz"
    finally:
        server.shutdown()
        server.server_close()


def test_ready_once_is_enough_by_default(flaky_url: str) -> None:
    localrun.wait_ready(flaky_url, timeout=5)


def test_a_streak_is_broken_by_any_refusal(flaky_url: str) -> None:
    localrun.wait_ready(flaky_url, timeout=5, times=3)  # three in a row happen between refusals
    with pytest.raises(TimeoutError, match="HTTP 503"):
        localrun.wait_ready(flaky_url, timeout=1.5, times=4)  # four in a row never do
