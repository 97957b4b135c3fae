"""The benchmarks' servers run with the services' own uvicorn options (flashcoupon_loadtest.serve).

Each service's `main()` runs with uvicorn.run replaced by a recorder (nothing is served, no
store is reached: create_app connects nothing before its lifespan), and what it passed must be
what serve.py starts the hello-world baseline and the benchmarked apps with.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest
import uvicorn
from flashcoupon_loadtest.serve import server_command, uvicorn_options

# What differs by design: where and how many, not how.
PLACEMENT = {"host", "port", "workers", "factory"}


def _captured(monkeypatch: pytest.MonkeyPatch, main: Any) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def record(app: Any, **kwargs: Any) -> None:
        seen.update(kwargs)

    monkeypatch.setattr(uvicorn, "run", record)
    main(["--port", "18080"])
    return {k: v for k, v in seen.items() if k not in PLACEMENT}


def _comparable(options: dict[str, Any]) -> dict[str, Any]:
    """The guarded protocol is a functools.partial: compare its class and deadlines."""
    http = options["http"]
    keywords = {k: v for k, v in http.keywords.items() if k != "service"}
    return {**options, "http": (http.func, keywords)}


@pytest.fixture
def service_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLASHCOUPON_ENV", "local")
    monkeypatch.setenv("FLASHCOUPON_GATEWAY_JWT_SECRET", "kq3Jv8ZpL0tW5nRc2YhB7mXe4AsDf9Gu")
    monkeypatch.setenv("FLASHCOUPON_GATEWAY_ISSUER_URLS", "http://127.0.0.1:1")
    for name in list(os.environ):
        if name.endswith(("_HEADER_TIMEOUT_SECONDS", "_BODY_TIMEOUT_SECONDS")):
            monkeypatch.delenv(name)


def test_gateway_is_served_as_the_bench_serves_it(
    monkeypatch: pytest.MonkeyPatch, service_env: None
) -> None:
    from flashcoupon_gateway.__main__ import main

    got = _captured(monkeypatch, main)
    assert _comparable(got) == _comparable(uvicorn_options("gateway"))


def test_issuer_is_served_as_the_bench_serves_it(
    monkeypatch: pytest.MonkeyPatch, service_env: None
) -> None:
    from flashcoupon_issuer.__main__ import main

    got = _captured(monkeypatch, main)
    assert _comparable(got) == _comparable(uvicorn_options("issuer"))


def test_hello_baseline_gets_the_gateways_options() -> None:
    assert _comparable(uvicorn_options("hello")) == _comparable(uvicorn_options("gateway"))


def test_server_commands() -> None:
    uv = server_command("m:app", 1234, factory=True, service="issuer")
    assert uv[:3] == [sys.executable, "-m", "flashcoupon_loadtest.serve"]
    assert uv[3:] == ["m:app", "--port", "1234", "--service", "issuer", "--factory"]
    gr = server_command("m:app", 1234, server="granian")
    assert gr[0].endswith("granian") and gr[-1] == "m:app"
    joined = " ".join(gr)
    for option in ("--interface asgi", "--loop uvloop", "--workers 1", "--no-access-log"):
        assert option in joined
    assert "--factory" not in gr
