"""Prometheus metrics of the persister (default registry, served on /metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

BATCHES = Counter("flashcoupon_persister_batches_total", "Batches written, one DB transaction each")
BATCH_SIZE = Histogram(
    "flashcoupon_persister_batch_size",
    "Records per batch handed to the writer",
    buckets=(1, 10, 50, 100, 250, 500, 1000, 2000, 5000, 10000),
)
ROWS = Counter(
    "flashcoupon_persister_rows_total",
    "Records by outcome: inserted, duplicate (already stored), dead_lettered",
    ["outcome"],
)
DB_WRITE_SECONDS = Histogram(
    "flashcoupon_persister_db_write_seconds",
    "Time to write one batch, transaction and transient-failure retries included",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
DLQ = Counter(
    "flashcoupon_persister_dlq_total",
    "Records sent to the dead-letter topic, by reason",
    ["reason"],
)
RETRIES = Counter(
    "flashcoupon_persister_retries_total",
    "Retries after a transient failure, by what failed (db, dlq)",
    ["what"],
)
DB_TIMEOUTS = Counter(
    "flashcoupon_persister_db_timeouts_total",
    "Batch writes abandoned because the database did not answer within DB_WRITE_TIMEOUT_S "
    "(its connection is discarded and the batch retried)",
)
COMMIT_FAILURES = Counter(
    "flashcoupon_persister_commit_failures_total",
    "Offset commits that failed (rebalance); the records are redelivered, harmlessly",
)
LAG = Gauge(
    "flashcoupon_persister_consumer_lag",
    "Records behind the partition's high watermark (highwater - position)",
    ["topic", "partition"],
)
PAUSED = Gauge(
    "flashcoupon_persister_paused",
    "1 while the assigned partitions are paused waiting for a transient failure to clear",
)

# Every label value known in advance starts at 0, so rate() and increase() see the first
# increment too (a labelled series is otherwise born with its first value, which they miss).
for _outcome in ("inserted", "duplicate", "dead_lettered"):
    ROWS.labels(_outcome)
for _reason in ("schema", "conflict", "constraint", "invalid"):
    DLQ.labels(_reason)
for _what in ("db", "dlq"):
    RETRIES.labels(_what)
