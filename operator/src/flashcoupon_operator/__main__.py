"""`python -m flashcoupon_operator`: run the CouponEvent operator (kopf) in this process.

FLASHCOUPON_OPERATOR_NAMESPACE limits it to one namespace (default: every namespace);
FLASHCOUPON_OPERATOR_LIVENESS is kopf's liveness endpoint (default http://0.0.0.0:8085/healthz);
FLASHCOUPON_OPERATOR_METRICS_PORT serves Prometheus /metrics (default 8086; 0 turns it off).
Run exactly one replica (Deployment strategy Recreate): there is no peering between replicas.
"""

from __future__ import annotations

import os

import kopf
from flashcoupon_common.logsetup import configure_logging
from flashcoupon_common.settings import MysqlSettings, RedisSettings, SettingsError
from prometheus_client import start_http_server

from flashcoupon_operator import handlers  # noqa: F401 - importing registers the handlers


def main() -> None:
    # Read before kopf starts: a missing or bad setting stops the process with one line, where
    # inside kopf's start-up activity it would be retried every minute forever.
    try:
        redis, mysql = RedisSettings.from_env(), MysqlSettings.from_env()
    except SettingsError as exc:
        raise SystemExit(f"flashcoupon-operator: {exc}") from None
    configure_logging("operator")
    namespace = os.environ.get("FLASHCOUPON_OPERATOR_NAMESPACE") or None
    metrics_port = int(os.environ.get("FLASHCOUPON_OPERATOR_METRICS_PORT", "8086"))
    if metrics_port:
        start_http_server(metrics_port)  # a daemon thread: kopf's loop is not involved
    kopf.run(
        memo=kopf.Memo(redis_settings=redis, mysql_settings=mysql),
        standalone=True,  # one replica: no peering objects needed in the cluster
        clusterwide=namespace is None,
        namespaces=[namespace] if namespace else (),
        liveness_endpoint=os.environ.get(
            "FLASHCOUPON_OPERATOR_LIVENESS", "http://0.0.0.0:8085/healthz"
        ),
    )


if __name__ == "__main__":
    main()
