"""Issuer settings: FLASHCOUPON_ISSUER_* plus the shared Redis Cluster nodes.

Read once at start-up; a malformed value fails start-up with a message naming the variable.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from flashcoupon_common.httpserver import ServerTimeouts
from flashcoupon_common.settings import (
    FromEnv,
    RedisSettings,
    non_negative,
    positive,
    setting,
    tcp_port,
)

PREFIX = "FLASHCOUPON_ISSUER_"


@dataclass(frozen=True)
class IssuerSettings(FromEnv):
    prefix = PREFIX

    redis: RedisSettings
    host: str = "127.0.0.1"
    port: int = setting(8081, check=tcp_port)
    # none: answer after the script ran on the master; replica: also WAIT for one replica
    # (docs/issuer.md says what each guarantees).
    durability: str = setting("none", choices=("none", "replica"))
    wait_timeout_ms: int = setting(200, check=positive)
    # replica: what an unconfirmed write answers. "fail" = 503 NOT_DURABLE (fail closed: every
    # issue is refused while the master has no replica, e.g. after a failover until the old
    # master rejoins); "degrade" = answer the coupon as with `none`, counted in
    # flashcoupon_issuer_unconfirmed_total and logged (docs/issuer.md has the trade-off).
    unconfirmed: str = setting("fail", choices=("fail", "degrade"))
    # How long a learned SOLD_OUT is answered locally before the script is asked again; a
    # supply change also clears it at once through pub/sub.
    sold_out_ttl_s: float = setting(2.0, check=non_negative)
    # Auto-pipelining; off only for the benchmark's naive one-EVALSHA-per-request variant.
    batching: bool = True
    # A batch is written as soon as it holds max_batch calls (redis_batch): under a crowd the
    # master runs one while the issuer reads the next presses. 32 and 4 measured best on 2 cores
    # (docs/issuer.md, "Batches on the wire at once").
    max_batch: int = setting(32, check=positive)
    max_inflight: int = setting(4, check=positive)
    # Whether a press may carry the shopper's allowance for issue.lua to decide (docs/gateway.md,
    # "Mixed versions"). Off, the issuer answers as one older than the
    # allowance does: a batch with an allowance is 400 MALFORMED_BATCH, the lone press's header
    # is ignored; the gateways then decide the shopper's limit themselves. A switch to roll the
    # feature back without a release.
    decide_allowance: bool = True
    # How issue.lua writes each outbox entry: one-field (CouponIssued.to_outbox), or a field per
    # value as before it, which relays older than the one-field entry read. Set `fields` while
    # such relays still run (docs/relay.md, "Upgrading relays from a field per value").
    outbox_entry: str = setting("one-field", choices=("one-field", "fields"))
    # How long one issue call may keep retrying through a failover before answering 503, when
    # the caller sent no deadline. The gateway sends X-Flashcoupon-Deadline-Ms (what it will
    # still wait); then the call ends DEADLINE_MARGIN_MS before that, so the 503 reaches the
    # gateway before it gives up (a gateway timeout would hide a coupon issued afterwards).
    retry_deadline_s: float = setting(15.0, check=positive)
    deadline_margin_ms: int = setting(300, check=non_negative)
    # Per node, for redis-py's own commands (the naive path and event reads); the batcher
    # uses max_inflight connections of its own per node.
    redis_max_connections: int = 512
    timeouts: ServerTimeouts = field(default_factory=ServerTimeouts)  # HEADER_/BODY_TIMEOUT_SECONDS
