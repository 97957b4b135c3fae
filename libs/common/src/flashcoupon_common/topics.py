"""Kafka topic names and partition counts, defined once for every service and the stack."""

from __future__ import annotations

COUPON_ISSUED = "coupon-issued"
COUPON_ISSUED_DLQ = "coupon-issued-dlq"
COUPON_REDEEMED = "coupon-redeemed"

# Partition counts used when the local stack (or a test) creates the topics.
PROJECT_TOPICS: dict[str, int] = {
    COUPON_ISSUED: 6,
    COUPON_ISSUED_DLQ: 1,
    COUPON_REDEEMED: 3,
}
