"""Issuer metrics: issuance outcomes and stock per event (batch sizes live in redis_batch).

The `event` label only ever carries provisioned event ids: answers for unknown ids are counted
under "unknown", and only answers about an existing event's stock set the stock gauge, so
random URLs cannot create series. A deleted event's series are removed (`forget_event`), an
ended event's stock gauge too.
"""

from __future__ import annotations

from flashcoupon_common.red_metrics import Children
from flashcoupon_common.tally import CounterTally
from prometheus_client import Counter, Gauge

# Counted on every press: tallies (flashcoupon_common.tally), no lock per increment.
ISSUANCE = CounterTally(
    "flashcoupon_issuer_issuance_total",
    "Issue requests by event and outcome (ISSUED: a new coupon, REPLAYED: one issued before, "
    "DUPLICATE, SOLD_OUT, ...)",
    ["event", "outcome"],
)
STOCK_REMAINING = Gauge(
    "flashcoupon_issuer_stock_remaining",
    "Coupons left per event, as last seen by this issuer process",
    ["event"],
)
SOLD_OUT_LOCAL = CounterTally(
    "flashcoupon_issuer_sold_out_local_total",
    "SOLD_OUT answers given from the local flag, without a Redis call",
    ["event"],
)

UNCONFIRMED = Counter(
    "flashcoupon_issuer_unconfirmed_total",
    "durability=replica with UNCONFIRMED=degrade: coupons answered 201 although no replica "
    "confirmed them in time (each one is lost if the master dies before replicating it)",
)

# Children, not labels(): labels() takes a lock and builds a tuple per call on the hot path.
_outcomes = Children(ISSUANCE)
_stock = Children(STOCK_REMAINING)
_local = Children(SOLD_OUT_LOCAL)


# Every outcome of an event starts at 0 before its first increment: rate() cannot see the
# increments a series is born with (a whole first scrape interval of a drop would be lost).
OUTCOMES = (
    "ISSUED", "REPLAYED", "DUPLICATE", "SOLD_OUT", "NOT_STARTED", "ENDED", "PAUSED", "NOT_DURABLE",
)  # fmt: skip


def watch_event(event_id: str) -> None:
    """Export the event's outcome series at 0 (called when provisioning announces the event)."""
    for outcome in OUTCOMES:
        _outcomes(event_id, outcome)


def count_outcome(event_id: str, outcome: str) -> None:
    if outcome == "NOT_FOUND":
        _outcomes("unknown", outcome).inc()
        return
    if not _outcomes.has(event_id, outcome):
        watch_event(event_id)  # an issuer started after the announcement
    _outcomes(event_id, outcome).inc()


# The latest stock per event, read by its gauge when Prometheus scrapes (set_function): the
# gauge is only ever read at a scrape, and a dict store costs a fraction of Gauge.set's lock.
_remaining: dict[str, int] = {}


def set_remaining(event_id: str, remaining: int) -> None:
    if event_id not in _remaining:
        _stock(event_id).set_function(lambda: _remaining.get(event_id, 0))
    _remaining[event_id] = remaining


def count_sold_out_local(event_id: str) -> None:
    _local(event_id).inc()


def forget_stock(event_id: str) -> None:
    _stock.forget(event_id)
    _remaining.pop(event_id, None)


def forget_event(event_id: str) -> None:
    """Remove every series labelled with `event_id` (the event was deleted)."""
    forget_stock(event_id)
    for children in (_local, _outcomes):
        children.forget(event_id)
