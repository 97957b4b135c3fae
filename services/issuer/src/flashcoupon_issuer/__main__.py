"""`flashcoupon-issuer`: the issuer on uvicorn (uvloop, httptools), settings from the env.

The HTTP protocol is uvicorn's httptools one with read deadlines and problem+json for requests
the parser refuses (flashcoupon_common.httpserver), set by HEADER_/BODY_TIMEOUT_SECONDS.
"""

from __future__ import annotations

import argparse
import os

import uvicorn
from flashcoupon_common import tracing
from flashcoupon_common.httpserver import server_options
from flashcoupon_common.logsetup import configure_logging
from flashcoupon_common.settings import settings_or_exit
from starlette.types import ASGIApp

from flashcoupon_issuer.app import create_app
from flashcoupon_issuer.settings import IssuerSettings


def build() -> ASGIApp:
    """App factory for uvicorn (each worker process builds its own app and clients)."""
    configure_logging("issuer")
    tracing.setup("issuer")  # in each worker: a span processor's thread does not survive a fork
    return create_app(IssuerSettings.from_env())


def main(argv: list[str] | None = None) -> None:
    settings = settings_or_exit("flashcoupon-issuer", IssuerSettings.from_env)
    parser = argparse.ArgumentParser(prog="flashcoupon-issuer")
    parser.add_argument("--host", default=settings.host)
    parser.add_argument("--port", type=int, default=settings.port)
    parser.add_argument("--workers", type=int, default=int(os.environ.get("WEB_CONCURRENCY", 1)))
    args = parser.parse_args(argv)
    configure_logging("issuer")
    uvicorn.run(
        "flashcoupon_issuer.__main__:build",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        **server_options("issuer", settings.timeouts),
    )


if __name__ == "__main__":
    main()
