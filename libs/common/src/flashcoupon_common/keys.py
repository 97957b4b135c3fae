"""Redis key layout (the parts several services agree on).

Every key of one event carries the hash tag `{ev:<event id>}`, so one Lua call touches one
slot and runs on one cluster node. The issuer owns the full layout of an event's runtime state
(documented in docs/redis-layout.md); the names here are the ones other services read.
"""

from __future__ import annotations

import functools

# A SET of event ids that have runtime state in Redis; relays discover outbox streams here.
# Not hash-tagged: it is read rarely and lives wherever its own slot is.
EVENTS_REGISTRY = "flashcoupon:events"

# Consumer group the outbox relays share on every event's outbox stream.
RELAY_GROUP = "relay"

# Pub/sub channels (classic PUBLISH: a cluster broadcasts them to every node). The message is
# the event id. issue.lua publishes SOLD_OUT_CHANNEL when the last coupon goes; provisioning
# publishes SUPPLY_CHANNEL whenever an event's config or supply changes (issuers then forget a
# cached sold-out flag). Both names are also spelled inside the Lua scripts.
SOLD_OUT_CHANNEL = "flashcoupon:soldout"
SUPPLY_CHANNEL = "flashcoupon:supply"


def event_tag(event_id: str) -> str:
    return "{ev:" + event_id + "}"


def outbox_key(event_id: str) -> str:
    """The event's outbox STREAM: one entry per issued coupon (fields: CouponIssued.to_outbox)."""
    return event_tag(event_id) + ":outbox"


def config_key(event_id: str) -> str:
    """HASH: spec JSON, window, perUserLimit, paused, secret, code prefix, tiers, version."""
    return event_tag(event_id) + ":cfg"


def stock_key(event_id: str) -> str:
    """HASH: n (coupons issued = next sequence number), q (quantity), per tier cK cap, iK issued."""
    return event_tag(event_id) + ":stock"


def users_key(event_id: str) -> str:
    """HASH: user id → holdings "code,tier,issuedAtMs,requestId" joined by ';'."""
    return event_tag(event_id) + ":users"


def allowance_key(event_id: str) -> str:
    """HASH: user id → GCRA TAT (µs) of the shopper's per-event allowance, when the gateway
    has issue.lua decide it; expires once every TAT in it has passed."""
    return event_tag(event_id) + ":allow"


@functools.lru_cache(maxsize=10_000)
def issue_keys(event_id: str) -> tuple[str, str, str, str, str]:
    """KEYS of issue.lua, in order (cached: the issuer asks for them on every request)."""
    return (
        config_key(event_id),
        stock_key(event_id),
        users_key(event_id),
        outbox_key(event_id),
        allowance_key(event_id),
    )


def event_keys(event_id: str) -> tuple[str, ...]:
    """Every key of an event's runtime state (what delete_state removes)."""
    return issue_keys(event_id)
