"""The gateway's Prometheus metrics (RED per route comes from flashcoupon_common.red_metrics)."""

from __future__ import annotations

from flashcoupon_common.tally import CounterTally
from prometheus_client import Gauge, Histogram

# Counters of answers (one increment per request in a storm of 429s, 202s or 503s): tallies,
# no lock per increment (flashcoupon_common.tally).
RATE_LIMITED = CounterTally(
    "flashcoupon_gateway_rate_limited_total",
    "Requests answered 429, by scope (ip, user, event) and where decided (local, redis)",
    ["scope", "where"],
)
QUEUE_LENGTH = Gauge(
    "flashcoupon_gateway_queue_length",
    "Shoppers waiting in an event's waiting room (tickets not yet admitted)",
    ["event"],
)
QUEUED = CounterTally(
    "flashcoupon_gateway_queued_total", "Issue requests answered 202 QUEUED", ["event"]
)
BREAKER_STATE = Gauge(
    "flashcoupon_gateway_breaker_state",
    "Circuit breaker per issuer upstream: 0 closed, 1 half-open, 2 open",
    ["upstream"],
)
SHED = CounterTally(
    "flashcoupon_gateway_shed_total",
    "Requests answered 503 without reaching an upstream, by reason",
    ["reason"],
)
UPSTREAM_DURATION = Histogram(
    "flashcoupon_gateway_upstream_duration_seconds",
    "Upstream call latency by upstream kind and outcome",
    ["upstream", "outcome"],
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
IN_FLIGHT = Gauge("flashcoupon_gateway_in_flight", "Requests being handled by this process")

# Label values known in advance start at 0, so rate() and increase() see the first increment
# too (a labelled series is otherwise born with its first value, which they miss).
for _scope in ("ip", "user", "event"):
    for _where in ("local", "redis"):
        RATE_LIMITED.labels(_scope, _where)
for _reason in (
    "breaker_open",
    "in_flight",
    "upstream_timeout",
    "upstream_error",
    "redis_unavailable",
):
    SHED.labels(_reason)
ISSUE_BATCH_SIZE = Histogram(
    "flashcoupon_gateway_issue_batch_size",
    "Presses per batch forwarded to an issuer (POST /internal/v1/issue-batch)",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
)
