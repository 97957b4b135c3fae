"""`flashcoupon-wallet`: the wallet API as a process (default 127.0.0.1:8082)."""

from __future__ import annotations

import argparse
import logging

import uvicorn
from flashcoupon_common.logsetup import configure_logging
from flashcoupon_common.settings import settings_or_exit

from flashcoupon_wallet.app import create_app
from flashcoupon_wallet.settings import WalletSettings

logger = logging.getLogger(__name__)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="flashcoupon-wallet", description=__doc__)
    parser.add_argument("--host", help="bind address (env FLASHCOUPON_WALLET_HOST)")
    parser.add_argument("--port", type=int, help="port (env FLASHCOUPON_WALLET_PORT)")
    args = parser.parse_args(argv)
    settings = settings_or_exit("flashcoupon-wallet", WalletSettings.from_env)
    configure_logging("wallet", settings.log_level)
    host = args.host or settings.host
    port = args.port or settings.port
    logger.info("wallet listening on %s:%d", host, port)
    uvicorn.run(
        create_app(settings),
        host=host,
        port=port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=10,
    )


if __name__ == "__main__":
    main()
