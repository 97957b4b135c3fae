"""Prometheus metrics of the outbox relay (names are a contract with dashboards and alerts).

Each relay instance has its own registry so several relays can live in one test process.
Gauges about a stream (length, pending, oldest age) are the same for every relay that watches
it: aggregate them with max(), not sum(); counters are per relay: sum() them.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class RelayMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.outbox_length = Gauge(
            "flashcoupon_relay_outbox_length",
            "Entries in the event's outbox stream not yet relayed (XLEN)",
            ["event"],
            registry=r,
        )
        self.outbox_pending = Gauge(
            "flashcoupon_relay_outbox_pending",
            "Entries read by some relay but not yet acknowledged (XPENDING count)",
            ["event"],
            registry=r,
        )
        self.oldest_age = Gauge(
            "flashcoupon_relay_outbox_oldest_age_seconds",
            "Age of the oldest entry still in the outbox (0 when empty): relay lag",
            ["event"],
            registry=r,
        )
        self.oldest_pending_age = Gauge(
            "flashcoupon_relay_outbox_oldest_pending_age_seconds",
            "Age of the oldest entry read by a relay but not yet acknowledged (0 when none)",
            ["event"],
            registry=r,
        )
        self.relayed = Counter(
            "flashcoupon_relay_relayed_total",
            "Outbox entries acknowledged by Kafka and removed from the stream",
            ["event"],
            registry=r,
        )
        self.dead_lettered = Counter(
            "flashcoupon_relay_dlq_total",
            "Undecodable outbox entries sent to the dead-letter topic",
            ["event"],
            registry=r,
        )
        self.claimed = Counter(
            "flashcoupon_relay_claimed_total",
            "Entries taken over from another (presumably dead) relay by XAUTOCLAIM",
            ["event"],
            registry=r,
        )
        self.send_failures = Counter(
            "flashcoupon_relay_send_failures_total",
            "Records Kafka did not acknowledge in an attempt (they are sent again)",
            ["error"],
            registry=r,
        )
        self.producer_recreations = Counter(
            "flashcoupon_relay_producer_recreations_total",
            "Kafka producers discarded and rebuilt after a fatal error or a stuck delivery",
            registry=r,
        )
        self.batch_size = Histogram(
            "flashcoupon_relay_batch_size",
            "Records per delivery attempt",
            buckets=(1, 10, 50, 100, 250, 500, 1000, 2000, 5000),
            registry=r,
        )
        self.ack_seconds = Histogram(
            "flashcoupon_relay_kafka_ack_seconds",
            "Time from the first send() of a batch until Kafka acknowledged all of it",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )

    def watch_event(self, event_id: str) -> None:
        """Start the event's counters at 0: rate() then sees the first batch relayed too."""
        for counter in (self.relayed, self.dead_lettered, self.claimed):
            counter.labels(event_id)

    def forget_event(self, event_id: str) -> None:
        for gauge in (
            self.outbox_length,
            self.outbox_pending,
            self.oldest_age,
            self.oldest_pending_age,
        ):
            try:
                gauge.remove(event_id)
            except KeyError:
                pass
