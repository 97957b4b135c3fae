"""Start one server process for a benchmark, with the options the services run with.

    python -m flashcoupon_loadtest.serve flashcoupon_loadtest.hello:app --port 8080
    python -m flashcoupon_loadtest.serve flashcoupon_issuer.__main__:build --factory --port 8081

Every benchmark server — the hello-world baseline, a service app under test — is started by
`server_command`, so a baseline never runs on a faster (or slower) server than the services.
The options are the services' own: flashcoupon_common.httpserver.server_options (uvloop, the
guarded httptools protocol, no access log, no log config, proxy headers off, the gateway's
keep-alive, the issuer's backlog); tests/unit/test_bench_serve.py runs each service's `main()`
with uvicorn.run recorded and fails if a service starts its server any other way.

`--server granian` serves the same app with granian (Rust HTTP server, ASGI interface, uvloop,
one worker, no access log, the same header read deadline): the alternative `make bench-servers`
measures.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Literal

from flashcoupon_common.httpserver import ServerTimeouts, server_options

Server = Literal["uvicorn", "granian"]
SERVERS: tuple[Server, ...] = ("uvicorn", "granian")

# "hello" is served like the gateway: it stands in for the process shoppers reach.
SERVICES = ("gateway", "issuer", "hello")


def uvicorn_options(service: str) -> dict[str, Any]:
    """uvicorn.run's keyword arguments for `service` (gateway, issuer, hello)."""
    return server_options("gateway" if service == "hello" else service, ServerTimeouts())


def server_command(
    app: str,
    port: int,
    *,
    factory: bool = False,
    server: Server = "uvicorn",
    service: str = "hello",
) -> list[str]:
    """The command line of one server process (1 worker) serving `app` on 127.0.0.1:`port`."""
    if server == "granian":
        exe = str(Path(sys.executable).parent / "granian")  # this venv's console script
        timeouts = ServerTimeouts()
        return [
            exe,
            "--interface", "asgi",
            "--loop", "uvloop",
            "--http", "1",
            "--workers", "1",
            "--no-access-log",
            "--log-level", "warning",
            "--backlog", "4096",
            "--http1-header-read-timeout", str(int(timeouts.header_timeout_seconds * 1000)),
            "--host", "127.0.0.1",
            "--port", str(port),
            *(["--factory"] if factory else []),
            app,
        ]  # fmt: skip
    return [
        sys.executable,
        "-m",
        "flashcoupon_loadtest.serve",
        app,
        "--port",
        str(port),
        "--service",
        service,
        *(["--factory"] if factory else []),
    ]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m flashcoupon_loadtest.serve")
    ap.add_argument("app", help="module:attribute")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--factory", action="store_true", help="app is a factory (services' build)")
    ap.add_argument("--service", default="hello", choices=SERVICES)
    args = ap.parse_args(argv)
    import uvicorn

    uvicorn.run(
        args.app,
        host="127.0.0.1",
        port=args.port,
        factory=args.factory,
        **uvicorn_options(args.service),
    )


if __name__ == "__main__":
    main()
