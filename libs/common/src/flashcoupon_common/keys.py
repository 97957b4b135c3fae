"""Redis key layout (the parts several services agree on).

Every key of one event carries the hash tag `{ev:<event id>}`, so one Lua call touches one
slot and runs on one cluster node. The issuer owns the full layout of an event's runtime state
(documented in docs/redis-layout.md); the names here are the ones other services read.
"""

from __future__ import annotations

# A SET of event ids that have runtime state in Redis; relays discover outbox streams here.
# Not hash-tagged: it is read rarely and lives wherever its own slot is.
EVENTS_REGISTRY = "flashcoupon:events"

# Consumer group the outbox relays share on every event's outbox stream.
RELAY_GROUP = "relay"


def event_tag(event_id: str) -> str:
    return "{ev:" + event_id + "}"


def outbox_key(event_id: str) -> str:
    """The event's outbox STREAM: one entry per issued coupon (fields: CouponIssued.to_outbox)."""
    return event_tag(event_id) + ":outbox"
