"""The dead-letter topic: records that can never be stored, with why and where they came from.

The original key and value are kept byte for byte, so a record can be replayed to the source
topic once its cause is fixed (see docs/persister.md). Sends are idempotent and awaited: the
consumer commits past a poison record only after the broker acknowledged its dead letter.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

from aiokafka.structs import ConsumerRecord
from flashcoupon_common.kafka_producer import (
    ProducerFactory,
    ProducerHolder,
    idempotent_producer_factory,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class DeadLetter:
    record: ConsumerRecord[bytes, bytes]
    reason: str  # schema | conflict | constraint | invalid
    code: str  # SCHEMA_ERROR, CODE_CONFLICT, SLOT_CONFLICT, MYSQL_1452, ...
    detail: str


class DeadLetterSendError(Exception):
    """The DLQ did not acknowledge; retry later (the batch is not committed meanwhile)."""


def dlq_headers(letter: DeadLetter, group_id: str) -> list[tuple[str, bytes]]:
    r = letter.record
    return [
        ("reason", letter.reason.encode()),
        ("error-code", letter.code.encode()),
        ("error-detail", letter.detail[:1000].encode()),
        ("original-topic", r.topic.encode()),
        ("original-partition", str(r.partition).encode()),
        ("original-offset", str(r.offset).encode()),
        ("original-timestamp", str(r.timestamp).encode()),
        ("consumer-group", group_id.encode()),
        # The source record's own headers (trace context) travel along, prefixed.
        *((f"original-header-{k}", v) for k, v in (r.headers or ())),
    ]


class DeadLetters:
    def __init__(
        self,
        bootstrap: str,
        topic: str,
        group_id: str,
        *,
        producer_factory: ProducerFactory | None = None,
    ) -> None:
        self.topic = topic
        self.group_id = group_id
        self._producer = ProducerHolder(
            producer_factory or idempotent_producer_factory(bootstrap, request_timeout_ms=15_000)
        )

    async def start(self) -> None:
        await self._producer.get()

    async def stop(self) -> None:
        await self._producer.close()

    async def send_all(self, letters: Sequence[DeadLetter]) -> None:
        """Send and wait for every acknowledgement, or raise DeadLetterSendError."""
        generation = None
        try:
            producer, generation = await self._producer.get()
            futures = [
                await producer.send(
                    self.topic,
                    value=x.record.value,
                    key=x.record.key,
                    headers=dlq_headers(x, self.group_id),
                )
                for x in letters
            ]
            await asyncio.gather(*futures)
        except Exception as exc:
            # An idempotent producer can be left unusable (OutOfOrderSequenceNumber after a
            # broker blip): start afresh; a resend may duplicate a dead letter, never lose one.
            logger.warning("dead-letter send failed (%r); recreating the producer", exc)
            if generation is not None:
                await self._producer.recreate(generation, exc)
            raise DeadLetterSendError(repr(exc)) from exc
