"""The waiting-room scenario against a real gateway and issuer: tickets held until admitted.

200 shoppers at an event with a waiting room (admit 100/s) and 150 coupons: first presses are
queued (or answered at once), and each ticket ends in exactly one answer — 150 coupons in
all, the rest sold out — whether the shopper follows the SSE stream or polls the JSON status.
"""

from __future__ import annotations

import os
import secrets
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from flashcoupon_loadtest import driver
from flashcoupon_loadtest.drop import DEFAULT_MANIFEST, couponctl_apply, demo_manifest
from flashcoupon_loadtest.localrun import LocalServices
from flashcoupon_loadtest.stats import outcomes_by_kind
from flashcoupon_loadtest.waiting_room import WaitingRoom


@pytest.mark.parametrize("sse", [True, False], ids=["sse", "poll"])
def test_waiting_room_admits_every_ticket_once(
    stack: Any, mysql_url: str, tmp_path: Path, sse: bool
) -> None:
    env = {**stack.env(), "FLASHCOUPON_MYSQL_URL": mysql_url}
    event_id = f"wr-{secrets.token_hex(4)}"
    with LocalServices(
        gateways=1,
        issuers=1,
        relays=0,
        persisters=0,
        wallet=False,
        env=env,
        log_dir=tmp_path / "logs",
    ) as services:
        doc = demo_manifest(
            DEFAULT_MANIFEST, name=event_id, quantity=150, start_at=datetime.now(UTC)
        )
        doc["spec"]["admission"] = {"waitingRoom": {"enabled": True, "admitPerSecond": 100}}
        couponctl_apply(doc, tmp_path, {**os.environ, **env})
        scenario = WaitingRoom(
            event_id=event_id,
            users=200,
            concurrency=200,
            sse=sse,
            forwarded_for=True,
            user_prefix=f"{event_id}-",
        )
        result = driver.run(scenario, services.gateway_urls, timeout=120)
    by_kind = outcomes_by_kind(result.records)
    # Queued (the gateway may also admit some presses at once while under the rate) ...
    assert set(by_kind["first"]) <= {"QUEUED", "ISSUED", "SOLD_OUT"}, by_kind
    assert by_kind["first"].get("QUEUED", 0) >= 100, by_kind
    # ... and every ticket ends in exactly one answer.
    assert sum(by_kind.get("admitted", {}).values()) == by_kind["first"]["QUEUED"], by_kind
    assert set(by_kind["admitted"]) <= {"ISSUED", "SOLD_OUT"}, by_kind
    issued = [r for r in result.records if r.code == "ISSUED"]
    assert len(issued) == 150, by_kind
    assert len({r.user for r in issued}) == len({r.coupon for r in issued}) == 150
