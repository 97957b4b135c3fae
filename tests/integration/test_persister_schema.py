"""The migrated database matches schema.py: the migrations and the metadata never drift."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from flashcoupon_common.db.schema import metadata
from sqlalchemy import inspect
from sqlalchemy.ext.asyncio import AsyncEngine


def _server_default_differs(ctx, insp_col, meta_col, insp_default, meta_default, rendered):  # type: ignore[no-untyped-def]
    # schema.py writes func.now(3), the migration CURRENT_TIMESTAMP(3): the same DDL, which
    # Alembic cannot see through; compare those two by their normalised text, defer the rest.
    def norm(value: str | None) -> str:
        v = (value or "").strip("'\"").lower().replace("now(", "current_timestamp(")
        return v

    if rendered and "now(" in rendered.lower():
        return norm(insp_default) != norm(rendered)
    return None


async def test_migrations_match_schema_metadata(mysql_engine: AsyncEngine) -> None:
    def diff(sync_conn):  # type: ignore[no-untyped-def]
        ctx = MigrationContext.configure(
            sync_conn,
            opts={"compare_type": True, "compare_server_default": _server_default_differs},
        )
        return compare_metadata(ctx, metadata)

    async with mysql_engine.connect() as conn:
        changes = await conn.run_sync(diff)
    assert changes == [], changes


async def test_read_queries_have_indexes(mysql_engine: AsyncEngine) -> None:
    def indexes(sync_conn):  # type: ignore[no-untyped-def]
        insp = inspect(sync_conn)
        return {
            tuple(ix["column_names"])
            for ix in insp.get_indexes("user_coupons") + insp.get_unique_constraints("user_coupons")
        }

    async with mysql_engine.connect() as conn:
        have = await conn.run_sync(indexes)
    # wallet: a user's coupons; persisted count / auditor per event; redemption by code;
    # exactly-once rows: the allowance slot and the code.
    for needed in [
        ("user_id", "issued_at"),
        ("event_id", "status"),
        ("code",),
        ("event_id", "user_id", "seq"),
    ]:
        assert needed in have, (needed, have)
