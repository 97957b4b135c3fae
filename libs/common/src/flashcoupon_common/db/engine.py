"""Async engine construction for MySQL/MariaDB through asyncmy."""

from __future__ import annotations

import warnings

from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from flashcoupon_common.settings import MysqlSettings

# asyncmy surfaces server warnings (e.g. duplicate-key notes) through Python's warnings
# machinery, which prints them on stderr; they are not errors and must not flood logs.
warnings.filterwarnings("ignore", module="asyncmy")


def create_engine(
    settings: MysqlSettings, *, pool_size: int = 10, echo: bool = False
) -> AsyncEngine:
    return create_async_engine(
        settings.url,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_recycle=1800,
        pool_pre_ping=True,
        echo=echo,
    )
