"""`flashcoupon-persister`: consume coupon-issued into MySQL; health/metrics on port 8083.

SIGTERM (uvicorn's handler) runs the lifespan shutdown: the current batch is finished and
committed, then the consumer leaves its group.
"""

from __future__ import annotations

import argparse
import sys

import uvicorn
from flashcoupon_common import tracing
from flashcoupon_common.logsetup import configure_logging
from flashcoupon_common.settings import settings_or_exit

from .app import create_app
from .settings import PersisterSettings


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="flashcoupon-persister", description=__doc__)
    parser.add_argument("--host", help="health/metrics bind address (FLASHCOUPON_PERSISTER_HOST)")
    parser.add_argument("--port", type=int, help="health/metrics port (FLASHCOUPON_PERSISTER_PORT)")
    args = parser.parse_args(argv)
    configure_logging("persister")
    settings = settings_or_exit("flashcoupon-persister", PersisterSettings.from_env)
    tracing.setup("persister")
    fatal: list[BaseException] = []
    server: uvicorn.Server | None = None

    def on_fatal(exc: BaseException) -> None:
        fatal.append(exc)
        if server is not None:
            server.should_exit = True

    app = create_app(settings, on_fatal=on_fatal)
    config = uvicorn.Config(
        app,
        host=args.host or settings.host,
        port=args.port or settings.port,
        lifespan="on",
        log_config=None,
        access_log=False,
    )
    server = uvicorn.Server(config)
    server.run()
    if fatal:
        sys.exit(1)
    if not server.started:
        sys.exit(3)


if __name__ == "__main__":
    main()
