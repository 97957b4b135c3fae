"""`flashcoupon-relay`: the outbox relay process (several may run; they share a consumer group).

It serves /healthz, /readyz (Redis and Kafka reachable) and /metrics on its port (8084) and
relays in the background. SIGTERM (handled by uvicorn) runs the lifespan's shutdown: the relay
finishes its in-flight batches, flushes and stops the producer, then the process exits.
"""

from __future__ import annotations

import argparse

import uvicorn
from flashcoupon_common import tracing
from flashcoupon_common.logsetup import configure_logging
from flashcoupon_common.settings import settings_or_exit

from flashcoupon_relay.app import create_app, died
from flashcoupon_relay.settings import PREFIX, RelaySettings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="flashcoupon-relay", description=__doc__)
    parser.add_argument("--host", default=None, help=f"bind address ({PREFIX}HOST)")
    parser.add_argument("--port", type=int, default=None, help=f"metrics port ({PREFIX}PORT)")
    args = parser.parse_args(argv)
    settings = settings_or_exit("flashcoupon-relay", RelaySettings.from_env)
    configure_logging("relay", settings.log_level)
    tracing.setup("relay")
    host = args.host or settings.host
    port = args.port or settings.port
    uvicorn.run(create_app(settings), host=host, port=port, log_config=None, access_log=False)
    return 1 if died.is_set() else 0


if __name__ == "__main__":
    raise SystemExit(main())
