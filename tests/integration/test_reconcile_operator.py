"""The kopf handlers, called the way kopf calls them, against the real Redis Cluster and MariaDB.

No Kubernetes API server here: each handler gets the keyword arguments kopf would pass (spec,
meta, status, a kopf.Patch, the memo holding the clients) and the test reads what it put in
`patch.status`. What this does not cover is kopf's own watching and patching loop.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import kopf
import pytest
from flashcoupon_common import event_state, keys
from flashcoupon_common.db.engine import create_engine
from flashcoupon_common.lua import ISSUE
from flashcoupon_common.settings import MysqlSettings
from flashcoupon_operator import catalog, handlers, runtime
from flashcoupon_operator.manifest import parse_manifest

from tests.support.names import random_name

LOG = logging.getLogger("test-operator")


def spec_body(start: timedelta = timedelta(minutes=-1), **changes: Any) -> dict[str, Any]:
    now = datetime.now(UTC).replace(microsecond=0)
    body: dict[str, Any] = {
        "title": "operator drop",
        "quantity": 100,
        "startAt": (now + start).isoformat(),
        "endAt": (now + start + timedelta(hours=2)).isoformat(),
        "tiers": [
            {"name": "big", "discount": {"type": "fixed", "amount": 10000}, "share": 10},
            {"name": "small", "discount": {"type": "percent", "percent": 5}, "share": 90},
        ],
    }
    body.update(changes)
    return body


@pytest.fixture
async def memo(redis_cluster: Any, mysql_url: str) -> AsyncIterator[kopf.Memo]:
    m = kopf.Memo()
    m.redis = redis_cluster
    m.engine = create_engine(MysqlSettings(mysql_url), pool_size=2)
    yield m
    await m.engine.dispose()


@pytest.fixture
async def name(redis_cluster: Any) -> AsyncIterator[str]:
    event_id = random_name("op")
    yield event_id
    await event_state.delete_state(redis_cluster, event_id)


async def run_apply(
    name: str, spec: dict[str, Any], memo: kopf.Memo, status: dict[str, Any] | None = None,
    generation: int = 1,
) -> dict[str, Any]:  # fmt: skip
    patch = kopf.Patch()
    await handlers.apply(
        name=name,
        spec=spec,
        meta={"name": name, "generation": generation},
        status=status or {},
        patch=patch,
        memo=memo,
        logger=LOG,
    )
    return dict(patch["status"])


def cond(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == kind)


async def test_create_preloads_and_reports_active(memo: kopf.Memo, name: str) -> None:
    status = await run_apply(name, spec_body(), memo)
    assert status["phase"] == "Active"
    assert (status["quantity"], status["issued"], status["remaining"]) == (100, 0, 100)
    assert cond(status, "Preloaded")["status"] == "True"
    assert cond(status, "SpecAccepted")["message"] == "new event"
    assert status["observedGeneration"] == 1
    assert await event_state.read_state(memo.redis, name) is not None
    assert await catalog.read_event(memo.engine, name) is not None


async def test_event_before_warmup_waits_then_timer_keeps_counters(
    memo: kopf.Memo, name: str
) -> None:
    body = spec_body(start=timedelta(hours=2))
    status = await run_apply(name, body, memo)
    assert status["phase"] == "Pending" and "preloadAt" in status
    assert await event_state.read_state(memo.redis, name) is None
    patch = kopf.Patch()
    await handlers.refresh(
        name=name, spec=body, meta={"generation": 1}, status=status, patch=patch, memo=memo
    )
    # None removes the field in kopf's merge patch: nothing is issued from Redis yet.
    assert patch["status"] == {
        "phase": "Pending",
        "quantity": 100,
        "issued": None,
        "remaining": None,
        "persisted": 0,
        "paused": False,
    }
    assert await event_state.read_state(memo.redis, name) is None


async def test_timer_waits_for_an_opening_before_its_next_tick(memo: kopf.Memo, name: str) -> None:
    # startAt comes within one refresh interval: the timer sleeps until it and reads again, so
    # the status shows Active even for a drop that sells out before the next tick. (On a slow
    # machine startAt may pass during the apply; the timer then reads Active at once.)
    body = spec_body(start=timedelta(seconds=handlers.REFRESH_SECONDS))
    status = await run_apply(name, body, memo)
    assert status["phase"] in ("Ready", "Active"), status
    patch = kopf.Patch()
    await handlers.refresh(
        name=name, spec=body, meta={"generation": 1}, status=status, patch=patch, memo=memo
    )
    assert patch["status"]["phase"] == "Active"


async def test_timer_finishes_a_preload_the_operator_crashed_in(memo: kopf.Memo, name: str) -> None:
    body = spec_body()

    def killed(done: int, total: int) -> None:
        raise RuntimeError("operator pod killed")

    with pytest.raises(RuntimeError):
        await runtime.apply(
            parse_manifest(
                {"apiVersion": "flashcoupon.io/v1alpha1", "kind": "CouponEvent",
                 "metadata": {"name": name}, "spec": body}
            ),
            redis=memo.redis, engine=memo.engine, progress=killed,
        )  # fmt: skip
    patch = kopf.Patch()
    await handlers.refresh(
        name=name, spec=body, meta={"generation": 1}, status={}, patch=patch, memo=memo
    )
    assert patch["status"]["phase"] == "Active"
    assert cond(dict(patch["status"]), "Preloaded")["status"] == "True"
    state = await event_state.read_state(memo.redis, name)
    assert state is not None and state.quantity == 100


async def test_refused_update_keeps_running_event_and_says_why(memo: kopf.Memo, name: str) -> None:
    first = await run_apply(name, spec_body(), memo)
    for i in range(30):
        k = keys.issue_keys(name)
        (reply,) = await memo.redis.eval(ISSUE.source, 5, *k, f"u{i}", f"r{i}", "", "", "")
        assert reply[0] == b"ISSUED"
    status = await run_apply(name, spec_body(quantity=10), memo, status=first, generation=2)
    accepted = cond(status, "SpecAccepted")
    assert (accepted["status"], accepted["reason"]) == ("False", "Rejected")
    assert "30 coupons are already issued" in accepted["message"]
    assert status["phase"] == "Active" and status["issued"] == 30
    # Preloaded did not flip, so its transition time is the one from the first apply.
    assert (
        cond(status, "Preloaded")["lastTransitionTime"]
        == cond(first, "Preloaded")["lastTransitionTime"]
    )
    state = await event_state.read_state(memo.redis, name)
    assert state is not None and state.quantity == 100


async def test_invalid_spec_fails_without_touching_anything(memo: kopf.Memo, name: str) -> None:
    status = await run_apply(name, spec_body(perUserLimt=3), memo)
    assert status["phase"] == "Failed"
    assert (
        cond(status, "SpecAccepted")["message"] == "invalid spec: spec.perUserLimt: unknown field"
    )
    assert await catalog.read_event(memo.engine, name) is None


async def test_mysql_down_is_a_temporary_error_with_failed_phase(
    redis_cluster: Any, name: str
) -> None:
    memo = kopf.Memo()
    memo.redis = redis_cluster
    memo.engine = create_engine(MysqlSettings("mysql+asyncmy://x:y@127.0.0.1:1/none"))
    patch = kopf.Patch()
    try:
        with pytest.raises(kopf.TemporaryError):
            await handlers.apply(
                name=name, spec=spec_body(), meta={"generation": 1}, status={}, patch=patch,
                memo=memo, logger=LOG,
            )  # fmt: skip
    finally:
        await memo.engine.dispose()
    assert patch["status"]["phase"] == "Failed"
    assert patch["status"]["message"].startswith("apply failed: ")


async def test_delete_waits_for_mysql_unless_forced(memo: kopf.Memo, name: str) -> None:
    await run_apply(name, spec_body(), memo)
    await memo.redis.eval(ISSUE.source, 5, *keys.issue_keys(name), "u1", "r1", "", "", "")
    with pytest.raises(kopf.TemporaryError) as info:
        await handlers.cleanup(name=name, meta={}, memo=memo)
    assert "not in MySQL yet" in str(info.value)
    assert await event_state.read_state(memo.redis, name) is not None
    forced = {"annotations": {handlers.FORCE_DELETE: "true"}}
    await handlers.cleanup(name=name, meta=forced, memo=memo)
    assert await event_state.read_state(memo.redis, name) is None
    row = await catalog.read_event(memo.engine, name)
    assert row is not None and row.deleted_at is not None


async def test_startup_sets_finalizer_and_watch_timeouts(stack: Any) -> None:
    settings = kopf.OperatorSettings()
    memo = kopf.Memo()
    await handlers.configure(settings=settings, memo=memo)
    try:
        assert settings.persistence.finalizer == "flashcoupon.io/cleanup"
        assert settings.watching.server_timeout == 300
        assert settings.watching.client_timeout == 330
        assert settings.posting.loggers and settings.posting.level == logging.WARNING
    finally:
        await handlers.close(memo=memo)
