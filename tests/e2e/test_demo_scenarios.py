"""The load scenarios against a real issuer process: open-loop rate, sold-out storm, and a
burst split over two driver processes.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from flashcoupon_loadtest import driver
from flashcoupon_loadtest.drop import DEFAULT_MANIFEST, couponctl_apply, demo_manifest
from flashcoupon_loadtest.localrun import LocalServices
from flashcoupon_loadtest.scenarios import Burst, SustainedRate, sold_out_storm
from flashcoupon_loadtest.stats import outcome_counts, outcomes_by_kind


@pytest.fixture
def issuer(stack: Any, mysql_url: str, tmp_path: Path) -> Iterator[tuple[LocalServices, dict]]:
    env = {**stack.env(), "FLASHCOUPON_MYSQL_URL": mysql_url}
    services = LocalServices(
        gateways=0,
        issuers=1,
        relays=0,
        persisters=0,
        wallet=False,
        env=env,
        log_dir=tmp_path / "logs",
    )
    with services:
        yield services, env


def new_event(env: dict, workdir: Path, quantity: int) -> str:
    event_id = f"sc-{secrets.token_hex(4)}"
    doc = demo_manifest(
        DEFAULT_MANIFEST, name=event_id, quantity=quantity, start_at=datetime.now(UTC)
    )
    couponctl_apply(doc, workdir, {**os.environ, **env})
    return event_id


def test_sustained_rate_is_open_loop_then_storm_is_all_sold_out(
    issuer: tuple[LocalServices, dict], tmp_path: Path
) -> None:
    services, env = issuer
    event_id = new_event(env, tmp_path, 100)
    rate = SustainedRate(event_id=event_id, mode="issuer", rate=200, duration=2, user_prefix="r-")
    result = driver.run(rate, services.issuer_urls, timeout=60)
    assert len(result.records) == 400
    assert outcome_counts(result.records) == {"SOLD_OUT": 300, "ISSUED": 100}
    # Request i is due at go + i/200 whatever the answers' latency: the schedule is exact.
    starts = sorted(r.t_start for r in result.records)
    assert starts[-1] - starts[0] == pytest.approx(399 / 200, abs=1e-3)

    storm = sold_out_storm(event_id, 500, mode="issuer", concurrency=16, user_prefix="s-")
    result = driver.run(storm, services.issuer_urls, timeout=60)
    assert outcome_counts(result.records) == {"SOLD_OUT": 500}


def test_burst_over_two_driver_processes_covers_every_shopper_once(
    issuer: tuple[LocalServices, dict], tmp_path: Path
) -> None:
    services, env = issuer
    event_id = new_event(env, tmp_path, 50)
    burst = Burst(
        event_id=event_id,
        mode="issuer",
        users=300,
        concurrency=8,
        dup_fraction=0.2,
        retry_fraction=0.1,
        user_prefix=f"{event_id}-",
    )
    result = driver.run(burst, services.issuer_urls, processes=2, timeout=60)
    by_kind = outcomes_by_kind(result.records)
    assert by_kind["first"] == {"ISSUED": 50, "SOLD_OUT": 250}, by_kind
    assert len({r.user for r in result.records if r.kind == "first"}) == 300
    assert "ISSUED" not in by_kind.get("dup", {})
    assert result.processes == 2 and result.cpu_seconds > 0
