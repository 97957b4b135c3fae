"""Provisioning through `runtime` (what couponctl and the operator call) on the real stack.

Coupons are issued with the issuer's own script (issue.lua), so the quantity rules are checked
against real issuance, not against numbers written by the test.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from flashcoupon_common import event_state, keys
from flashcoupon_common.db.engine import create_engine
from flashcoupon_common.db.schema import user_coupons
from flashcoupon_common.event_spec import EventSpec, TierSpec
from flashcoupon_common.lua import ISSUE
from flashcoupon_common.messages import Discount
from flashcoupon_common.settings import MysqlSettings
from flashcoupon_operator import catalog, runtime
from flashcoupon_operator.reconcile import Action
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.names import random_name

BIG = TierSpec("big", Discount("fixed", amount=10_000), 10)
SMALL = TierSpec("small", Discount("percent", percent=5, max_amount=3000), 90)


def make_spec(
    event_id: str, quantity: int = 100, start: timedelta = timedelta(minutes=-1)
) -> EventSpec:
    now = datetime.now(UTC).replace(microsecond=0)
    return EventSpec(
        event_id, "drop", quantity, now + start, now + timedelta(hours=2), (BIG, SMALL)
    )


@pytest.fixture
async def engine(mysql_url: str) -> AsyncIterator[AsyncEngine]:
    eng = create_engine(MysqlSettings(mysql_url), pool_size=2)
    yield eng
    await eng.dispose()


@pytest.fixture
async def names(redis_cluster: Any) -> AsyncIterator[list[str]]:
    made: list[str] = []
    yield made
    for name in made:
        await event_state.delete_state(redis_cluster, name)


def new_name(names: list[str]) -> str:
    names.append(random_name("rec"))
    return names[-1]


async def issue(redis: Any, event_id: str, count: int) -> list[str]:
    codes = []
    for i in range(count):
        k = keys.issue_keys(event_id)
        (reply,) = await redis.eval(ISSUE.source, 5, *k, f"u{i}", f"r{i}", "", "", "")
        assert reply[0] == b"ISSUED", reply
        codes.append(reply[4].decode())
    return codes


async def test_raise_accepted_lower_below_issued_rejected(
    redis_cluster: Any, engine: AsyncEngine, names: list[str]
) -> None:
    spec = make_spec(new_name(names), quantity=20)
    await runtime.apply(spec, redis=redis_cluster, engine=engine)
    await issue(redis_cluster, spec.event_id, 15)

    raised = await runtime.apply(
        dataclasses.replace(spec, quantity=50), redis=redis_cluster, engine=engine
    )
    assert raised.changes == ("quantity: 20 → 50",)
    state = await event_state.read_state(redis_cluster, spec.event_id)
    assert state is not None and (state.quantity, state.issued, state.remaining) == (50, 15, 35)
    row = await catalog.read_event(engine, spec.event_id)
    assert row is not None and row.quantity == 50
    assert sum(t.quantity for t in await catalog.read_tiers(engine, spec.event_id)) == 50

    with pytest.raises(runtime.Rejected) as info:
        lowered = dataclasses.replace(spec, quantity=10)
        await runtime.apply(lowered, redis=redis_cluster, engine=engine)
    assert info.value.plan.rejection == (
        "spec.quantity: cannot lower to 10: 15 coupons are already issued"
    )
    state = await event_state.read_state(redis_cluster, spec.event_id)
    assert state is not None and state.quantity == 50
    row = await catalog.read_event(engine, spec.event_id)
    assert row is not None and row.quantity == 50  # the refused spec was not written anywhere


async def test_crash_mid_preload_then_reapply_equals_clean_apply(
    redis_cluster: Any, engine: AsyncEngine, names: list[str]
) -> None:
    crashed = make_spec(new_name(names), quantity=5000)
    clean = dataclasses.replace(crashed, event_id=new_name(names))
    calls: list[tuple[int, int]] = []

    def dies(done: int, total: int) -> None:
        calls.append((done, total))
        raise RuntimeError("operator pod killed mid-preload")

    with pytest.raises(RuntimeError):
        await runtime.apply(crashed, redis=redis_cluster, engine=engine, progress=dies)
    assert calls == [(0, 5000)]  # it died after the catalog, before Redis was loaded
    assert await catalog.read_event(engine, crashed.event_id) is not None
    status = await runtime.status(redis_cluster, engine, crashed.event_id)
    assert status.phase == "Preloading" and status.issued is None

    done = await runtime.apply(crashed, redis=redis_cluster, engine=engine)
    assert done.actions == (Action.WRITE_CATALOG, Action.PROVISION)
    await runtime.apply(clean, redis=redis_cluster, engine=engine)

    got = await event_state.read_state(redis_cluster, crashed.event_id)
    want = await event_state.read_state(redis_cluster, clean.event_id)
    assert got is not None and want is not None
    same = {"event_id": "", "version": 0}
    assert dataclasses.replace(got, **same) == dataclasses.replace(want, **same)
    assert got.tier_quantities == {"big": 500, "small": 4500}
    assert await catalog.read_tiers(engine, crashed.event_id) == await catalog.read_tiers(
        engine, clean.event_id
    )
    assert (await runtime.status(redis_cluster, engine, crashed.event_id)).phase == "Active"


async def test_crash_after_preload_reapply_is_exact(
    redis_cluster: Any, engine: AsyncEngine, names: list[str]
) -> None:
    spec = make_spec(new_name(names), quantity=300)

    def dies_at_the_end(done: int, total: int) -> None:
        if done == total:
            raise RuntimeError("killed right after the preload")

    with pytest.raises(RuntimeError):
        await runtime.apply(spec, redis=redis_cluster, engine=engine, progress=dies_at_the_end)
    await issue(redis_cluster, spec.event_id, 3)
    await runtime.apply(spec, redis=redis_cluster, engine=engine)
    state = await event_state.read_state(redis_cluster, spec.event_id)
    assert state is not None and (state.quantity, state.issued) == (300, 3)


async def test_tier_change_before_start_repreloads_and_keeps_pause(
    redis_cluster: Any, engine: AsyncEngine, names: list[str]
) -> None:
    spec = make_spec(new_name(names), quantity=100, start=timedelta(hours=1))
    # The operator's way: an hour before the start (warm-up 10 m) only the catalog is written.
    waiting = await runtime.apply(spec, redis=redis_cluster, engine=engine)
    assert waiting.actions == (Action.WRITE_CATALOG,)
    assert waiting.preload_at == spec.start_at - timedelta(minutes=10)
    assert await event_state.read_state(redis_cluster, spec.event_id) is None
    assert (await runtime.status(redis_cluster, engine, spec.event_id)).phase == "Pending"
    # couponctl's way: preload now.
    await runtime.apply(spec, redis=redis_cluster, engine=engine, preload_now=True)
    assert (await runtime.status(redis_cluster, engine, spec.event_id)).phase == "Ready"
    await runtime.set_paused(redis_cluster, spec.event_id, True)

    gold = TierSpec("gold", Discount("fixed", amount=50_000), 25)
    changed = dataclasses.replace(spec, tiers=(gold, dataclasses.replace(SMALL, share=75)))
    done = await runtime.apply(changed, redis=redis_cluster, engine=engine, preload_now=True)
    assert Action.RESET_STATE in done.actions
    state = await event_state.read_state(redis_cluster, spec.event_id)
    assert state is not None and state.tier_quantities == {"gold": 25, "small": 75}
    assert state.paused  # the emergency switch survived the re-preload
    tiers = await catalog.read_tiers(engine, spec.event_id)
    assert [(t.name, t.quantity) for t in tiers] == [("small", 75), ("gold", 25)]


async def test_tier_change_after_issuance_is_rejected(
    redis_cluster: Any, engine: AsyncEngine, names: list[str]
) -> None:
    spec = make_spec(new_name(names))
    await runtime.apply(spec, redis=redis_cluster, engine=engine)
    await issue(redis_cluster, spec.event_id, 1)
    changed = dataclasses.replace(spec, tiers=(dataclasses.replace(BIG, share=100),))
    with pytest.raises(runtime.Rejected) as info:
        await runtime.apply(changed, redis=redis_cluster, engine=engine)
    assert str(info.value).startswith("spec.tiers: cannot change")


async def test_move_start_before_it_opens(
    redis_cluster: Any, engine: AsyncEngine, names: list[str]
) -> None:
    spec = make_spec(new_name(names), start=timedelta(hours=1))
    await runtime.apply(spec, redis=redis_cluster, engine=engine, preload_now=True)
    earlier = dataclasses.replace(spec, start_at=spec.start_at - timedelta(hours=2))
    await runtime.apply(earlier, redis=redis_cluster, engine=engine)
    state = await event_state.read_state(redis_cluster, spec.event_id)
    assert state is not None and state.start_at == earlier.start_at
    assert (await runtime.status(redis_cluster, engine, spec.event_id)).phase == "Active"
    assert len(await issue(redis_cluster, spec.event_id, 2)) == 2  # the doors really opened


async def test_delete_waits_for_persisted_coupons_and_keeps_history(
    redis_cluster: Any, engine: AsyncEngine, names: list[str]
) -> None:
    spec = make_spec(new_name(names))
    await runtime.apply(spec, redis=redis_cluster, engine=engine)
    await issue(redis_cluster, spec.event_id, 2)
    with pytest.raises(runtime.NotPersisted):
        await runtime.delete(redis_cluster, engine, spec.event_id)
    assert await event_state.read_state(redis_cluster, spec.event_id) is not None

    # What the persister does: write the issued coupons to MySQL.
    def db_time(ms: int) -> datetime:
        return catalog.to_db_time(datetime.fromtimestamp(ms / 1000, UTC))

    async with engine.begin() as conn:
        async for c in event_state.iter_issued(redis_cluster, spec.event_id):
            d = c.discount
            row = {"event_id": c.event_id, "user_id": c.user_id, "seq": c.seq, "code": c.code}
            await conn.execute(
                user_coupons.insert().values(
                    **row,
                    tier=c.tier,
                    discount_type=d.type,
                    amount=d.amount,
                    percent=d.percent,
                    max_amount=d.max_amount,
                    issued_at=db_time(c.issued_at_ms),
                    expires_at=db_time(c.expires_at_ms),
                    request_id=c.request_id,
                )
            )
    assert await runtime.delete(redis_cluster, engine, spec.event_id) == (True, True)
    assert await event_state.read_state(redis_cluster, spec.event_id) is None
    status = await runtime.status(redis_cluster, engine, spec.event_id)
    assert status.deleted_at is not None and status.persisted == 2

    # The name holds history now: applying it again is refused, nothing is preloaded.
    with pytest.raises(runtime.Rejected) as info:
        await runtime.apply(spec, redis=redis_cluster, engine=engine)
    assert "use a new metadata.name" in str(info.value)
    assert await event_state.read_state(redis_cluster, spec.event_id) is None


async def test_deleted_name_without_coupons_can_be_applied_again(
    redis_cluster: Any, engine: AsyncEngine, names: list[str]
) -> None:
    spec = make_spec(new_name(names))
    await runtime.apply(spec, redis=redis_cluster, engine=engine)
    assert await runtime.delete(redis_cluster, engine, spec.event_id) == (True, True)
    await runtime.apply(spec, redis=redis_cluster, engine=engine)
    row = await catalog.read_event(engine, spec.event_id)
    assert row is not None and row.deleted_at is None
    assert (await runtime.status(redis_cluster, engine, spec.event_id)).remaining == 100


async def test_status_of_unknown_event(redis_cluster: Any, engine: AsyncEngine) -> None:
    with pytest.raises(runtime.NotFound):
        await runtime.status(redis_cluster, engine, random_name("nope"))


async def test_issuance_racing_a_lowering_is_refused_and_catalog_restored(
    stack: Any, redis_cluster: Any, engine: AsyncEngine, names: list[str]
) -> None:
    from redis.cluster import ClusterNode, RedisCluster

    # One tier, so that only the total decides (per-tier room is random with several).
    only = (dataclasses.replace(BIG, share=100),)
    spec = dataclasses.replace(make_spec(new_name(names), quantity=20), tiers=only)
    await runtime.apply(spec, redis=redis_cluster, engine=engine)
    await issue(redis_cluster, spec.event_id, 10)
    shoppers = RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in stack.redis.nodes])

    def shoppers_arrive(done: int, total: int) -> None:
        # Between the plan (10 issued: lowering to 12 is fine) and the preload, 5 more win.
        if done == 0:
            for i in range(5):
                (reply,) = shoppers.eval(
                    ISSUE.source,
                    5,
                    *keys.issue_keys(spec.event_id),
                    f"late{i}",
                    f"rl{i}",
                    "",
                    "",
                    "",
                )
                assert reply[0] == b"ISSUED"

    lowered = dataclasses.replace(spec, quantity=12)
    try:
        with pytest.raises(runtime.Rejected) as info:
            await runtime.apply(
                lowered, redis=redis_cluster, engine=engine, progress=shoppers_arrive
            )
    finally:
        shoppers.close()
    assert "lowering below issued is refused" in str(info.value)
    state = await event_state.read_state(redis_cluster, spec.event_id)
    assert state is not None and (state.quantity, state.issued) == (20, 15)
    row = await catalog.read_event(engine, spec.event_id)
    assert row is not None and row.quantity == 20
