"""The persister's spans: one per stored record, a child of the relay span that published it.

A span per record rather than one per batch: the record's trace then reaches MySQL without
span links, which few trace UIs follow. Each costs ~10-20 us of CPU (start and end, queued for
the exporter thread), paid only with tracing on.
"""

from __future__ import annotations

from aiokafka.structs import ConsumerRecord
from flashcoupon_common import tracing
from flashcoupon_common.messages import CouponIssued


def write_spans(
    origins: list[ConsumerRecord[bytes, bytes]], coupons: list[CouponIssued]
) -> list[tracing.Span]:
    """One span per record around its batch's DB write, a child of the relay's span named in
    the record's traceparent header (records without one get none: no orphan traces)."""
    spans = []
    for r, c in zip(origins, coupons, strict=True):
        tp = tracing.header(r.headers)
        if tp:
            attributes = {
                "db.system": "mysql",
                "messaging.kafka.partition": r.partition,
                "messaging.kafka.offset": r.offset,
                "flashcoupon.event_id": c.event_id,
                "flashcoupon.batch_size": len(coupons),
            }
            spans.append(
                tracing.start("store coupon", tp, kind=tracing.CONSUMER, attributes=attributes)
            )
    return spans
