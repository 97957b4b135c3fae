"""`python -m flashcoupon_operator`: run the CouponEvent operator (kopf) in this process.

FLASHCOUPON_OPERATOR_NAMESPACE limits it to one namespace (default: every namespace);
FLASHCOUPON_OPERATOR_LIVENESS is kopf's liveness endpoint (default http://0.0.0.0:8085/healthz);
FLASHCOUPON_OPERATOR_METRICS_PORT serves Prometheus /metrics (default 8086; 0 turns it off).
Run exactly one replica (Deployment strategy Recreate): there is no peering between replicas.
"""

from __future__ import annotations

from dataclasses import dataclass

import kopf
from flashcoupon_common.logsetup import configure_logging
from flashcoupon_common.settings import (
    FromEnv,
    MysqlSettings,
    RedisSettings,
    non_negative,
    setting,
    settings_or_exit,
)
from prometheus_client import start_http_server

from flashcoupon_operator import handlers  # noqa: F401 - importing registers the handlers


@dataclass(frozen=True)
class OperatorSettings(FromEnv):
    prefix = "FLASHCOUPON_OPERATOR_"

    redis: RedisSettings
    mysql: MysqlSettings
    namespace: str | None = None  # None: every namespace
    liveness: str = "http://0.0.0.0:8085/healthz"
    metrics_port: int = setting(8086, check=non_negative)  # 0: no /metrics


def main() -> None:
    # Read before kopf starts: a missing or bad setting stops the process with one line, where
    # inside kopf's start-up activity it would be retried every minute forever.
    settings = settings_or_exit("flashcoupon-operator", OperatorSettings.from_env)
    configure_logging("operator")
    if settings.metrics_port:
        start_http_server(settings.metrics_port)  # a daemon thread: kopf's loop is not involved
    namespace = settings.namespace
    kopf.run(
        memo=kopf.Memo(redis_settings=settings.redis, mysql_settings=settings.mysql),
        standalone=True,  # one replica: no peering objects needed in the cluster
        clusterwide=namespace is None,
        namespaces=[namespace] if namespace else (),
        liveness_endpoint=settings.liveness,
    )


if __name__ == "__main__":
    main()
