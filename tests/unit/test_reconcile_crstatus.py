"""The CouponEvent status dict the operator writes (crstatus.cr_status)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from flashcoupon_operator.crstatus import cr_status
from flashcoupon_operator.model import EventStatus
from flashcoupon_operator.reconcile import Action, Plan

NOW = datetime(2026, 11, 27, 5, 1, tzinfo=UTC)
START = datetime(2026, 11, 27, 5, 0, tzinfo=UTC)


def event(issued: int | None = 40, phase: str | None = "Active") -> EventStatus:
    return EventStatus(
        event_id="bf",
        phase=phase,  # type: ignore[arg-type]
        quantity=100,
        issued=issued,
        remaining=None if issued is None else 100 - issued,
        persisted=38,
        start_at=START,
        end_at=START + timedelta(hours=1),
        paused=False,
    )


APPLIED = Plan("bf", (Action.WRITE_CATALOG, Action.PROVISION), ("quantity: 50 → 100",))


def conditions(status: dict) -> dict[str, dict]:
    return {c["type"]: c for c in status["conditions"]}


def test_active_event_status_has_counters_and_true_conditions() -> None:
    st = cr_status(event=event(), plan=APPLIED, error=None, generation=3, now=NOW)
    assert {k: st[k] for k in ("phase", "quantity", "issued", "remaining", "persisted")} == {
        "phase": "Active",
        "quantity": 100,
        "issued": 40,
        "remaining": 60,
        "persisted": 38,
    }
    assert st["observedGeneration"] == 3
    c = conditions(st)
    assert c["Preloaded"]["status"] == "True"
    assert c["SpecAccepted"] == {
        "type": "SpecAccepted",
        "status": "True",
        "reason": "Applied",
        "message": "quantity: 50 → 100",
        "lastTransitionTime": "2026-11-27T05:01:00Z",
        "observedGeneration": 3,
    }


def test_every_call_returns_the_full_conditions_list() -> None:
    st = cr_status(event=event(), plan=None, error=None, generation=1, now=NOW)
    assert [c["type"] for c in st["conditions"]] == ["Preloaded", "SpecAccepted"]


def test_transition_time_kept_while_status_unchanged_and_moved_on_flip() -> None:
    first = cr_status(event=event(), plan=APPLIED, error=None, generation=1, now=NOW)
    later = NOW + timedelta(minutes=5)
    again = cr_status(event=event(), plan=None, error=None, generation=1, now=later, previous=first)
    assert conditions(again)["Preloaded"]["lastTransitionTime"] == "2026-11-27T05:01:00Z"
    refused = Plan("bf", changes=("quantity: 100 → 10",), rejection="spec.quantity: no")
    flip = cr_status(
        event=event(), plan=refused, error=None, generation=2, now=later, previous=again
    )
    accepted = conditions(flip)["SpecAccepted"]
    assert (accepted["status"], accepted["reason"], accepted["message"]) == (
        "False",
        "Rejected",
        "spec.quantity: no",
    )
    assert accepted["lastTransitionTime"] == "2026-11-27T05:06:00Z"
    # A refused change leaves the running event as it was: the phase comes from Redis.
    assert flip["phase"] == "Active" and flip["message"] == "spec.quantity: no"


def test_waiting_for_warmup_reports_preload_time() -> None:
    waiting = Plan("bf", (Action.WRITE_CATALOG,), ("new event",), preload_at=START)
    st = cr_status(
        event=event(issued=None, phase="Pending"), plan=waiting, error=None, generation=1, now=NOW
    )
    assert st["phase"] == "Pending"
    assert st["preloadAt"] == "2026-11-27T05:00:00Z"
    loaded = conditions(st)["Preloaded"]
    assert (loaded["status"], loaded["reason"]) == ("False", "Waiting")


def test_apply_error_is_failed_phase() -> None:
    st = cr_status(event=None, plan=None, error="Redis unreachable", generation=4, now=NOW)
    assert st["phase"] == "Failed" and st["message"] == "Redis unreachable"
    c = conditions(st)
    assert c["Preloaded"]["reason"] == "Failed"
    assert c["SpecAccepted"]["reason"] == "ApplyFailed"


def test_every_status_field_is_declared_in_the_crd() -> None:
    # Undeclared status fields would be pruned by the API server (kopf pitfall).
    from tests.unit.test_manifest_crd import SCHEMA

    declared = SCHEMA["properties"]["status"]["properties"]
    item = declared["conditions"]["items"]["properties"]
    waiting = Plan("bf", (Action.WRITE_CATALOG,), preload_at=START)
    for st in (
        cr_status(event=event(), plan=APPLIED, error=None, generation=1, now=NOW),
        cr_status(event=event(None, "Pending"), plan=waiting, error=None, generation=1, now=NOW),
        cr_status(event=None, plan=None, error="down", generation=1, now=NOW),
    ):
        assert set(st) <= set(declared), set(st) - set(declared)
        assert st.get("phase") in declared["phase"]["enum"]
        for c in st["conditions"]:
            assert set(c) <= set(item)
