"""Load shedding decisions that need no server: the in-flight bound and client IPs."""

from __future__ import annotations

from dataclasses import replace

import pytest
from flashcoupon_common.http import ProblemError
from flashcoupon_gateway.service import Gateway, client_ip, upstream_headers
from flashcoupon_gateway.settings import GatewaySettings
from starlette.requests import Request

from tests.support.env import LOCAL

SETTINGS = GatewaySettings.from_env(
    {**LOCAL, "FLASHCOUPON_GATEWAY_JWT_SECRET": "unit-test-secret-0123456789-abcdefghijklmnop"}
)


def request(headers: dict[str, str], peer: str = "10.0.0.9") -> Request:
    raw = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return Request({"type": "http", "headers": raw, "client": (peer, 5555), "method": "POST"})


def test_in_flight_bound_answers_503_at_once() -> None:
    g = Gateway(replace(SETTINGS, max_in_flight=2), None, None, None, None, None, None)  # type: ignore[arg-type]
    with g.slot(), g.slot():
        with pytest.raises(ProblemError) as err, g.slot():
            pass
        assert err.value.status == 503 and err.value.headers["Retry-After"] == "1"
    assert g.in_flight == 0
    with g.slot():
        assert g.in_flight == 1


def test_client_ip_trusts_only_the_configured_hops() -> None:
    r = request({"X-Forwarded-For": "6.6.6.6, 1.2.3.4, 10.0.0.1"})
    assert client_ip(r, 0) == "10.0.0.9"  # no trusted proxy: the peer
    assert client_ip(r, 1) == "10.0.0.1"
    assert client_ip(r, 2) == "1.2.3.4"
    assert client_ip(request({}), 1) == "10.0.0.9"
    unix = Request({"type": "http", "headers": [], "method": "POST"})  # a server without a peer
    assert client_ip(unix, 0) == client_ip(unix, 1) == "unknown"


def test_upstream_headers_replace_any_client_user_header() -> None:
    r = request(
        {"X-Flashcoupon-User": "mallory", "traceparent": "00-" + "a" * 32 + "-" + "b" * 16 + "-01"}
    )
    headers = upstream_headers(r, "alice")
    assert headers["X-Flashcoupon-User"] == "alice"
    assert [k for k in headers if k.lower() == "x-flashcoupon-user"] == ["X-Flashcoupon-User"]
    assert headers["traceparent"].startswith("00-")
    with pytest.raises(ProblemError):
        upstream_headers(request({"Idempotency-Key": "has space"}), "alice")


def test_header_values_read_as_starlette_reads_them() -> None:
    """header_value (one pass over the raw headers) answers what request.headers.get does:
    the first of repeated headers, None when absent, Latin-1 values, any name case sent."""
    from flashcoupon_gateway.service import header_value

    raw = [
        (b"x-request-id", b"first"),
        (b"authorization", b"Bearer abc"),
        (b"x-request-id", b"second"),
        (b"x-note", "caf\u00e9".encode("latin-1")),
    ]
    ours = Request({"type": "http", "headers": raw, "method": "POST"})
    theirs = Request({"type": "http", "headers": raw, "method": "POST"})
    for name in ("x-request-id", "authorization", "x-note", "traceparent", "idempotency-key"):
        assert header_value(ours, name.encode()) == theirs.headers.get(name), name
    assert header_value(ours, b"x-request-id") == "first"
    assert header_value(ours, b"x-note") == "caf\u00e9"
    assert header_value(ours, b"traceparent") is None
