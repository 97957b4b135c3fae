"""`flashcoupon-auditor --all` over a private Redis Cluster, so its event registry holds only
this test's events (the shared one lists every other test's events too)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from flashcoupon_common import event_state, keys
from flashcoupon_common.db.schema import user_coupons
from flashcoupon_common.redis_cluster import create_redis_cluster
from flashcoupon_common.settings import RedisSettings
from sqlalchemy import delete, insert
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.issuer import issue_coupons
from tests.support.names import random_name
from tests.support.private_stack import private_redis
from tests.support.stack import Stack
from tests.support.wallet import add_event


async def persist_directly(engine: AsyncEngine, redis: Any, event_id: str) -> None:
    """Test set-up only: the rows the persister would have written for the event."""
    rows = []
    async for c in event_state.iter_issued(redis, event_id):
        rows.append(
            {
                "event_id": c.event_id,
                "user_id": c.user_id,
                "seq": c.seq,
                "code": c.code,
                "tier": c.tier,
                "discount_type": c.discount.type,
                "amount": c.discount.amount,
                "percent": c.discount.percent,
                "max_amount": c.discount.max_amount,
                "issued_at": datetime.fromtimestamp(c.issued_at_ms / 1000, UTC).replace(
                    tzinfo=None
                ),
                "expires_at": datetime.now(UTC).replace(tzinfo=None) + timedelta(days=1),
                "request_id": c.request_id,
            }
        )
    async with engine.begin() as conn:
        await conn.execute(insert(user_coupons), rows)


async def test_all_audits_every_registered_event_and_skips_deleted_ones(
    stack: Stack, mysql_url: str, mysql_engine: AsyncEngine
) -> None:
    server, ports = private_redis(nodes=3, replicas=0)
    await asyncio.to_thread(server.start)
    redis = create_redis_cluster(RedisSettings(tuple(("127.0.0.1", p) for p in ports)))
    try:
        await redis.initialize()
        clean = await issue_coupons(redis, 6)
        drifted = await issue_coupons(redis, 6)
        ghost = random_name("ghost")
        await redis.sadd(keys.EVENTS_REGISTRY, ghost)  # registered, state already deleted
        for spec in (clean, drifted):
            await add_event(mysql_engine, spec.event_id)
            await persist_directly(mysql_engine, redis, spec.event_id)
        async with mysql_engine.begin() as conn:
            await conn.execute(
                delete(user_coupons).where(
                    user_coupons.c.event_id == drifted.event_id,
                    user_coupons.c.user_id == "user-0",
                )
            )

        env = {
            **stack.env(),
            "FLASHCOUPON_MYSQL_URL": mysql_url,
            "FLASHCOUPON_REDIS_NODES": ",".join(f"127.0.0.1:{p}" for p in ports),
        }
        proc = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "flashcoupon_persister.auditor_cli", "--all", "--json"],
            env=env,
            capture_output=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 1, proc.stderr.decode()
        body = orjson.loads(proc.stdout)
        summary = {e["eventId"]: (e["clean"], e["missing"], e["extra"]) for e in body["events"]}
        assert summary == {clean.event_id: (True, 0, 0), drifted.event_id: (False, 1, 0)}
        assert ghost.encode() in proc.stderr  # the skip is said, not silent
    finally:
        await redis.aclose()
        await asyncio.to_thread(server.stop)
