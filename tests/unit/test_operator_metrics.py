"""The operator's metrics: one phase series set to 1, drift inputs, series gone on delete."""

from __future__ import annotations

from datetime import UTC, datetime

from flashcoupon_operator import metrics
from flashcoupon_operator.runtime import EventStatus
from prometheus_client import REGISTRY

T = datetime(2026, 11, 23, tzinfo=UTC)


def _status(name: str, phase: str | None, issued: int | None, persisted: int) -> EventStatus:
    return EventStatus(
        event_id=name,
        phase=phase,  # type: ignore[arg-type]
        quantity=10,
        issued=issued,
        remaining=None if issued is None else 10 - issued,
        persisted=persisted,
        start_at=T,
        end_at=T,
        paused=False,
    )


def _value(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def test_phase_counters_and_forget() -> None:
    metrics.observe_event(_status("ev-m", "Active", 7, 5))
    assert _value("flashcoupon_operator_event_phase", event="ev-m", phase="Active") == 1
    assert _value("flashcoupon_operator_event_phase", event="ev-m", phase="Preloading") == 0
    assert _value("flashcoupon_operator_event_issued", event="ev-m") == 7
    assert _value("flashcoupon_operator_event_persisted", event="ev-m") == 5

    metrics.observe_event(_status("ev-m", "SoldOut", 10, 10))
    assert _value("flashcoupon_operator_event_phase", event="ev-m", phase="SoldOut") == 1
    assert _value("flashcoupon_operator_event_phase", event="ev-m", phase="Active") == 0

    metrics.observe_event(_status("ev-m", "Preloading", None, 0))  # state dropped: no issued
    assert _value("flashcoupon_operator_event_issued", event="ev-m") is None

    metrics.observe_event(_status("ev-m", None, None, 0))  # catalog row marked deleted
    assert _value("flashcoupon_operator_event_phase", event="ev-m", phase="Preloading") is None
    assert _value("flashcoupon_operator_event_persisted", event="ev-m") is None


def test_reconcile_results() -> None:
    before = _value("flashcoupon_operator_reconciles_total", handler="refresh", result="ok")
    metrics.count("refresh", "ok")
    after = _value("flashcoupon_operator_reconciles_total", handler="refresh", result="ok")
    assert after == (before or 0) + 1
    assert (_value("flashcoupon_operator_last_success_timestamp_seconds") or 0) > 0
