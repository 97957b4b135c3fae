"""Alembic environment: runs migrations over the async engine."""

from __future__ import annotations

import asyncio

from alembic import context
from flashcoupon_common.db.schema import metadata
from sqlalchemy.engine import Connection
from sqlalchemy.ext.asyncio import create_async_engine


def _run(connection: Connection) -> None:
    context.configure(connection=connection, target_metadata=metadata)
    with context.begin_transaction():
        context.run_migrations()


async def _online() -> None:
    url = context.config.get_main_option("sqlalchemy.url")
    assert url is not None, "migrate.py sets sqlalchemy.url"
    engine = create_async_engine(url)
    try:
        async with engine.connect() as conn:
            await conn.run_sync(_run)
    finally:
        await engine.dispose()


asyncio.run(_online())
