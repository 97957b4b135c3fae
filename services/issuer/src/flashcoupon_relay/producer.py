"""The relay's Kafka producer: the library's idempotent producer, tuned for outbox batches.

One producer serves every stream the relay relays, held by flashcoupon_common's ProducerHolder,
which rebuilds it after a fatal error; records it never delivered stay pending in Redis.
"""

from __future__ import annotations

from flashcoupon_common.kafka_producer import ProducerFactory, idempotent_producer_factory

from flashcoupon_relay.settings import RelaySettings


def relay_producer_factory(settings: RelaySettings) -> ProducerFactory:
    return idempotent_producer_factory(
        settings.kafka.bootstrap,
        client_id=f"flashcoupon-relay-{settings.consumer}",
        linger_ms=settings.linger_ms,
        # Records are ~400 bytes; big batches mean fewer produce round trips, which is what
        # limits an idempotent producer (one in-flight request per partition).
        max_batch_size=512 * 1024,
        # Delivery itself is bounded by the relay's own delivery timeout.
        request_timeout_ms=min(settings.delivery_timeout_ms, 30_000),
    )
