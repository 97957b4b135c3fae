"""`couponctl` as an operator-person runs it: `uv run couponctl ...` against the real stack.

Each test gets its own MySQL database (mysql_url, passed as FLASHCOUPON_MYSQL_URL) and a random
event name; Redis Cluster is the shared local one.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from flashcoupon_common import event_state
from flashcoupon_common.db.engine import create_engine
from flashcoupon_common.settings import MysqlSettings
from flashcoupon_operator import catalog
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.support.names import random_name
from tests.support.paths import ROOT
from tests.support.stack import Stack


def manifest(
    name: str,
    *,
    quantity: int = 1000,
    start: timedelta = timedelta(minutes=-1),
    end: timedelta = timedelta(hours=1),
    extra: str = "",
) -> str:
    now = datetime.now(UTC).replace(microsecond=0)
    return (
        "apiVersion: flashcoupon.io/v1alpha1\nkind: CouponEvent\n"
        f"metadata: {{name: {name}}}\n"
        "spec:\n"
        f"  title: test drop {name}\n"
        f"  quantity: {quantity}\n"
        f"  startAt: '{(now + start).isoformat()}'\n"
        f"  endAt: '{(now + end).isoformat()}'\n"
        "  tiers:\n"
        "    - {name: big, discount: {type: fixed, amount: 10000}, share: 10}\n"
        "    - {name: small, discount: {type: percent, percent: 5, maxAmount: 3000}, share: 90}\n"
        + extra
    )


async def couponctl(
    stack: Stack, mysql_url: str, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = stack.env() | {"FLASHCOUPON_MYSQL_URL": mysql_url}
    return await asyncio.to_thread(
        subprocess.run,
        ["uv", "run", "--frozen", "couponctl", *args],
        cwd=ROOT,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
async def engine(mysql_url: str) -> AsyncIterator[AsyncEngine]:
    eng = create_engine(MysqlSettings(mysql_url), pool_size=2)
    yield eng
    await eng.dispose()


@pytest.fixture
async def event_name(redis_cluster: Any) -> AsyncIterator[str]:
    name = random_name("cctl")
    yield name
    await event_state.delete_state(redis_cluster, name)


async def test_apply_status_apply_again_delete(
    stack: Stack,
    mysql_url: str,
    engine: AsyncEngine,
    redis_cluster: Any,
    event_name: str,
    tmp_path: Path,
) -> None:
    path = tmp_path / "event.yaml"
    path.write_text(manifest(event_name, quantity=10_000))

    first = await couponctl(stack, mysql_url, "apply", "-f", str(path))
    assert first.returncode == 0, first.stderr
    assert f"couponevent/{event_name} created" in first.stdout
    # A 10,000-coupon event is "large": progress lines end at 100 %.
    assert f"preloading {event_name}: 100% (10,000/10,000)" in first.stdout
    state = await event_state.read_state(redis_cluster, event_name)
    assert state is not None and state.quantity == 10_000 and state.issued == 0
    rows = await catalog.read_tiers(engine, event_name)
    assert [(t.name, t.share, t.quantity) for t in rows] == [("big", 10, 1000), ("small", 90, 9000)]
    row = await catalog.read_event(engine, event_name)
    assert row is not None and row.quantity == 10_000 and row.deleted_at is None

    status = await couponctl(stack, mysql_url, "status", event_name, "--json")
    assert status.returncode == 0, status.stderr
    doc = json.loads(status.stdout)
    assert doc["phase"] == "Active"
    assert (doc["quantity"], doc["issued"], doc["remaining"], doc["persisted"]) == (
        10_000,
        0,
        10_000,
        0,
    )
    assert doc["paused"] is False
    assert doc["tiers"] == [
        {"name": "big", "quantity": 1000, "issued": 0},
        {"name": "small", "quantity": 9000, "issued": 0},
    ]

    again = await couponctl(stack, mysql_url, "apply", "-f", str(path))
    assert again.returncode == 0, again.stderr
    assert f"couponevent/{event_name} unchanged" in again.stdout
    state2 = await event_state.read_state(redis_cluster, event_name)
    assert state2 is not None
    # Same state; only the provision counter moved (it counts applies, not content).
    assert {**_fields(state2), "version": 0} == {**_fields(state), "version": 0}
    assert await catalog.read_tiers(engine, event_name) == rows

    listed = await couponctl(stack, mysql_url, "list", "--json")
    assert listed.returncode == 0, listed.stderr
    mine = [e for e in json.loads(listed.stdout) if e["eventId"] == event_name]
    assert [(e["phase"], e["remaining"]) for e in mine] == [("Active", 10_000)]

    human = await couponctl(stack, mysql_url, "status", event_name)
    assert "phase      Active" in human.stdout and "remaining  10,000" in human.stdout

    gone = await couponctl(stack, mysql_url, "delete", event_name)
    assert gone.returncode == 0, gone.stderr
    assert await event_state.read_state(redis_cluster, event_name) is None
    assert not await redis_cluster.sismember("flashcoupon:events", event_name)
    row = await catalog.read_event(engine, event_name)
    assert row is not None and row.deleted_at is not None
    after = await couponctl(stack, mysql_url, "status", event_name, "--json")
    assert json.loads(after.stdout)["phase"] == "Deleted"
    twice = await couponctl(stack, mysql_url, "delete", event_name)
    assert twice.returncode == 1 and "nothing to delete" in twice.stderr


def _fields(state: Any) -> dict[str, Any]:
    return {k: getattr(state, k) for k in state.__dataclass_fields__}


async def test_invalid_manifest_exits_2_listing_every_error(
    stack: Stack, mysql_url: str, tmp_path: Path
) -> None:
    bad = manifest("Bad_Name", quantity=0, start=timedelta(hours=2), end=timedelta(hours=1))
    bad = bad.replace("share: 90", "share: 80").replace("amount: 10000", "amount: -1")
    path = tmp_path / "bad.yaml"
    path.write_text(bad + "  warmup: soon\n")
    for command in ("validate", "apply"):
        result = await couponctl(stack, mysql_url, command, "-f", str(path))
        assert result.returncode == 2
        lines = [line.strip() for line in result.stderr.splitlines()]
        assert lines[0] == f"{path}: 6 error(s):"
        assert [line.split(":")[0] for line in lines[1:]] == [
            "metadata.name",
            "spec.quantity",
            "spec.endAt",
            "spec.warmup",
            "spec.tiers[0].discount.amount",
            "spec.tiers",
        ], result.stderr
        assert result.stdout == ""


async def test_rejected_change_exits_3_and_changes_nothing(
    stack: Stack, mysql_url: str, redis_cluster: Any, event_name: str
) -> None:
    created = await couponctl(stack, mysql_url, "apply", "-f", "-", stdin=manifest(event_name))
    assert created.returncode == 0, created.stderr
    moved = manifest(event_name, start=timedelta(minutes=5))  # the event is already open
    result = await couponctl(stack, mysql_url, "apply", "-f", "-", stdin=moved)
    assert result.returncode == 3
    assert "spec.startAt: cannot move once the event has started" in result.stderr
    state = await event_state.read_state(redis_cluster, event_name)
    assert state is not None and state.start_at < datetime.now(UTC)


async def test_pause_and_resume(
    stack: Stack, mysql_url: str, redis_cluster: Any, event_name: str
) -> None:
    # The demo's way: the example file under a fresh name, opening in an hour.
    example = str(ROOT / "k8s/examples/black-friday.yaml")
    created = await couponctl(
        stack, mysql_url, "apply", "-f", example, "--name", event_name, "--start-in", "1h"
    )
    assert created.returncode == 0, created.stderr
    assert "phase Ready, quantity 10,000, remaining 10,000" in created.stdout
    paused = await couponctl(stack, mysql_url, "pause", event_name)
    assert paused.returncode == 0 and f"couponevent/{event_name} paused" in paused.stdout
    state = await event_state.read_state(redis_cluster, event_name)
    assert state is not None and state.paused
    resumed = await couponctl(stack, mysql_url, "resume", event_name)
    assert resumed.returncode == 0
    state = await event_state.read_state(redis_cluster, event_name)
    assert state is not None and not state.paused
    missing = await couponctl(stack, mysql_url, "pause", random_name("nope"))
    assert missing.returncode == 1 and "not provisioned" in missing.stderr
