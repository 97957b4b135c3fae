"""Relay test helpers: the outbox helpers the relay benchmark uses too
(flashcoupon_loadtest.outbox), and the relay's own metrics."""

from __future__ import annotations

from flashcoupon_loadtest.outbox import (
    cleanup_event,
    codes_of,
    make_coupons,
    outbox_drained,
    read_all,
    register,
    relay_settings,
    running,
    write_outbox,
)
from flashcoupon_relay.relay import Relay

__all__ = [
    "cleanup_event",
    "codes_of",
    "make_coupons",
    "metric",
    "outbox_drained",
    "read_all",
    "register",
    "relay_settings",
    "running",
    "write_outbox",
]


def metric(relay: Relay, name: str, **labels: str) -> float:
    return relay.metrics.registry.get_sample_value(name, labels) or 0.0
