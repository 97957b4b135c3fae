"""flashcoupon-gateway: run the gateway with uvicorn (uvloop + httptools).

The HTTP protocol is uvicorn's httptools one with read deadlines and problem+json for requests
the parser refuses (flashcoupon_common.httpserver), set by HEADER_/BODY_TIMEOUT_SECONDS.
"""

from __future__ import annotations

import argparse
import logging
import os

import uvicorn
from flashcoupon_common import tracing
from flashcoupon_common.httpserver import server_options
from flashcoupon_common.logsetup import configure_logging
from flashcoupon_common.settings import settings_or_exit

from flashcoupon_gateway.app import create_app
from flashcoupon_gateway.settings import GatewaySettings


def _logging() -> None:
    configure_logging("gateway")
    tracing.setup("gateway")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per upstream call


def factory() -> object:
    """App factory for uvicorn's --workers mode (each worker builds its own app)."""
    _logging()
    return create_app(GatewaySettings.from_env())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="flashcoupon-gateway")
    parser.add_argument("--host", default=None)
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args(argv)
    _logging()
    settings = settings_or_exit("flashcoupon-gateway", GatewaySettings.from_env)
    host = args.host or settings.host
    port = args.port or settings.port
    common = {
        "host": host,
        "port": port,
        **server_options("gateway", settings.timeouts),
    }
    if args.workers > 1:
        os.environ["FLASHCOUPON_GATEWAY_PORT"] = str(port)
        uvicorn.run(
            "flashcoupon_gateway.__main__:factory", factory=True, workers=args.workers, **common
        )
    else:
        uvicorn.run(create_app(settings), **common)


if __name__ == "__main__":
    main()
