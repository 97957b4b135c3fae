"""The operator's Prometheus metrics: reconcile results, and each event's phase and counters.

The operator is the one component that already reads, every refresh, both what Redis issued
and what MySQL holds for an event; exporting those two numbers makes Redis↔MySQL drift an
alertable series (`issued - persisted`; docs/metrics.md) without a second reader. Series are
labelled only with CouponEvent names (objects that exist) and removed when an event is deleted.
"""

from __future__ import annotations

from typing import get_args

from prometheus_client import Counter, Gauge

from flashcoupon_operator.model import EventStatus, Phase

PHASES: tuple[str, ...] = get_args(Phase)

RECONCILES = Counter(
    "flashcoupon_operator_reconciles_total",
    "Handler runs by handler (apply, refresh, cleanup) and result (ok, rejected, error)",
    ["handler", "result"],
)
LAST_SUCCESS = Gauge(
    "flashcoupon_operator_last_success_timestamp_seconds",
    "Unix time of the last handler run that reached Redis and MySQL",
)
PHASE = Gauge(
    "flashcoupon_operator_event_phase",
    "1 for the event's current phase, 0 for the others (kube-state-metrics style)",
    ["event", "phase"],
)
ISSUED = Gauge(
    "flashcoupon_operator_event_issued",
    "Coupons the event's Redis state says were issued (absent before the preload)",
    ["event"],
)
PERSISTED = Gauge(
    "flashcoupon_operator_event_persisted",
    "Rows of the event in MySQL user_coupons",
    ["event"],
)
QUANTITY = Gauge("flashcoupon_operator_event_quantity", "The event's supply", ["event"])

for _handler in ("apply", "refresh", "cleanup"):
    for _result in ("ok", "rejected", "error"):
        RECONCILES.labels(_handler, _result)  # every series from the start: rate() sees the 1st


def count(handler: str, result: str) -> None:
    RECONCILES.labels(handler, result).inc()
    if result != "error":
        LAST_SUCCESS.set_to_current_time()


def observe_event(event: EventStatus) -> None:
    """Export what one status read saw."""
    name = event.event_id
    if event.phase is None:  # the catalog row is marked deleted
        forget_event(name)
        return
    for phase in PHASES:
        PHASE.labels(name, phase).set(1 if phase == event.phase else 0)
    QUANTITY.labels(name).set(event.quantity)
    PERSISTED.labels(name).set(event.persisted)
    if event.issued is not None:
        ISSUED.labels(name).set(event.issued)
    else:
        _remove(ISSUED, name)


def forget_event(name: str) -> None:
    for phase in PHASES:
        _remove(PHASE, name, phase)
    for gauge in (ISSUED, PERSISTED, QUANTITY):
        _remove(gauge, name)


def _remove(metric: Gauge, *labels: str) -> None:
    try:
        metric.remove(*labels)
    except KeyError:
        pass
