"""Issuer metrics: issuance outcomes and stock per event (batch sizes live in redis_batch).

The `event` label only ever carries provisioned event ids: answers for unknown ids are counted
under "unknown", and only answers about an existing event's stock set the stock gauge, so
random URLs cannot create series. A deleted event's series are removed (`forget_event`), an
ended event's stock gauge too.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

ISSUANCE = Counter(
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
SOLD_OUT_LOCAL = Counter(
    "flashcoupon_issuer_sold_out_local_total",
    "SOLD_OUT answers given from the local flag, without a Redis call",
    ["event"],
)

UNCONFIRMED = Counter(
    "flashcoupon_issuer_unconfirmed_total",
    "durability=replica with UNCONFIRMED=degrade: coupons answered 201 although no replica "
    "confirmed them in time (each one is lost if the master dies before replicating it)",
)

_children: dict[tuple[str, str], object] = {}


# Every outcome of an event starts at 0 before its first increment: rate() cannot see the
# increments a series is born with (a whole first scrape interval of a drop would be lost).
OUTCOMES = (
    "ISSUED", "REPLAYED", "DUPLICATE", "SOLD_OUT", "NOT_STARTED", "ENDED", "PAUSED", "NOT_DURABLE",
)  # fmt: skip


def watch_event(event_id: str) -> None:
    """Export the event's outcome series at 0 (called when provisioning announces the event)."""
    for outcome in OUTCOMES:
        if (event_id, outcome) not in _children:
            _children[event_id, outcome] = ISSUANCE.labels(event_id, outcome)


def count_outcome(event_id: str, outcome: str) -> None:
    # labels() takes a lock and builds a tuple per call; the hot path reuses the children.
    key = (event_id if outcome != "NOT_FOUND" else "unknown", outcome)
    child = _children.get(key)
    if child is None:
        if outcome != "NOT_FOUND":
            watch_event(event_id)  # an issuer started after the announcement
        child = _children.get(key) or _children.setdefault(key, ISSUANCE.labels(*key))
    child.inc()  # type: ignore[attr-defined]


_stock: dict[str, object] = {}


def set_remaining(event_id: str, remaining: int) -> None:
    child = _stock.get(event_id)
    if child is None:
        child = _stock[event_id] = STOCK_REMAINING.labels(event_id)
    child.set(remaining)  # type: ignore[attr-defined]


_local: dict[str, object] = {}


def count_sold_out_local(event_id: str) -> None:
    child = _local.get(event_id)
    if child is None:
        child = _local[event_id] = SOLD_OUT_LOCAL.labels(event_id)
    child.inc()  # type: ignore[attr-defined]


def forget_stock(event_id: str) -> None:
    if _stock.pop(event_id, None) is not None:
        STOCK_REMAINING.remove(event_id)


def forget_event(event_id: str) -> None:
    """Remove every series labelled with `event_id` (the event was deleted)."""
    forget_stock(event_id)
    if _local.pop(event_id, None) is not None:
        SOLD_OUT_LOCAL.remove(event_id)
    for key in [k for k in _children if k[0] == event_id]:
        del _children[key]
        ISSUANCE.remove(*key)
