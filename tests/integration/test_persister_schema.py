"""The migrated database matches schema.py: the migrations and the metadata never drift."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from flashcoupon_common.db.schema import metadata
from sqlalchemy import inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from tests.conftest import Stack, random_name


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


async def test_migrate_cli_downgrades_the_outbox_and_upgrades_again(
    mysql_url: str, mysql_engine: AsyncEngine
) -> None:
    def migrate(*args: str) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "flashcoupon_common.db.migrate", *args],
            env={"FLASHCOUPON_MYSQL_URL": mysql_url, "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return proc.stdout

    async def tables() -> set[str]:
        async with mysql_engine.connect() as conn:
            return set(await conn.run_sync(lambda c: inspect(c).get_table_names()))

    assert "0003 (head)" in await asyncio.to_thread(migrate, "current")
    await asyncio.to_thread(migrate, "downgrade", "0001")
    assert "redeemed_outbox" not in await tables() and "user_coupons" in await tables()
    await asyncio.to_thread(migrate, "upgrade")
    assert "redeemed_outbox" in await tables()


async def test_identifiers_are_byte_exact_in_a_database_with_an_insensitive_default(
    stack: Stack,
) -> None:
    # MySQL 8 creates databases accent- and case-insensitive unless told otherwise; there
    # josé-X and jose-X would be one user to UNIQUE (event_id, user_id, seq) and to the wallet.
    from flashcoupon_common.db.migrate import upgrade

    base = make_url(stack.mysql.url)
    db = random_name("t").replace("-", "_")
    admin = create_async_engine(base)
    engine = create_async_engine(base.set(database=db))
    try:
        async with admin.begin() as conn:
            await conn.execute(
                text(f"CREATE DATABASE `{db}` CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci")
            )
        await asyncio.to_thread(upgrade, base.set(database=db).render_as_string(False))
        async with engine.begin() as conn:
            await conn.execute(
                text(
                    "INSERT INTO coupon_events (id, title, quantity, per_user_limit, start_at,"
                    " end_at, valid_for_seconds, spec) VALUES"
                    " ('ev', 't', 10, 1, NOW(3), NOW(3), 60, '{}')"
                )
            )
            for user, code in (("josé-X", "Ab3"), ("jose-X", "AB3"), ("JOSÉ-X", "ab3")):
                await conn.execute(
                    text(
                        "INSERT INTO user_coupons (event_id, user_id, seq, code, tier,"
                        " discount_type, amount, issued_at, expires_at, request_id)"
                        " VALUES ('ev', :u, 1, :c, 'big', 'fixed', 100, NOW(3), NOW(3), :c)"
                    ),
                    {"u": user, "c": code},
                )
            mine = await conn.execute(
                text("SELECT code FROM user_coupons WHERE user_id = :u"), {"u": "josé-X"}
            )
            assert [r.code for r in mine] == ["Ab3"]
    finally:
        await engine.dispose()
        async with admin.begin() as conn:
            await conn.execute(text(f"DROP DATABASE IF EXISTS `{db}`"))
        await admin.dispose()
