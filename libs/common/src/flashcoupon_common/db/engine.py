"""Async engine construction for MySQL/MariaDB through asyncmy."""

from __future__ import annotations

import warnings

from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from flashcoupon_common.settings import MysqlSettings

# asyncmy surfaces server warnings (e.g. duplicate-key notes) through Python's warnings
# machinery, which prints them on stderr; they are not errors and must not flood logs.
warnings.filterwarnings("ignore", module="asyncmy")


def create_engine(
    settings: MysqlSettings,
    *,
    pool_size: int = 10,
    echo: bool = False,
    connect_timeout_s: float = 10.0,
    pool_timeout_s: float = 30.0,
    read_timeout_s: float | None = None,
) -> AsyncEngine:
    """connect_timeout_s bounds the TCP connect (a hung host that drops SYNs); pool_timeout_s
    bounds the wait for a free pooled connection; read_timeout_s, when given, bounds each wait
    for the server's answer (the driver raises OperationalError and drops the connection), for
    callers that must not wait forever on a hung server and must not cancel (probes.py)."""
    connect_args: dict[str, float] = {"connect_timeout": connect_timeout_s}
    if read_timeout_s is not None:
        connect_args["read_timeout"] = read_timeout_s
    return create_async_engine(
        settings.url,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_recycle=1800,
        pool_pre_ping=True,
        pool_timeout=pool_timeout_s,
        connect_args=connect_args,
        echo=echo,
    )
