"""Readiness probe for the local stack's Kafka: a port that accepts connections is not yet a
broker that takes writes, so create the project's topics and round-trip one message through an
idempotent producer (acks=all) and a manually committing consumer."""

from __future__ import annotations

import asyncio
import sys
import time
import uuid

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError
from flashcoupon_common.topics import PROJECT_TOPICS


async def ensure_topics(bootstrap: str, replication: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        wanted = [
            NewTopic(name, num_partitions=partitions, replication_factor=replication)
            for name, partitions in PROJECT_TOPICS.items()
            if name not in existing
        ]
        if wanted:
            try:
                await admin.create_topics(wanted)
            except TopicAlreadyExistsError:
                pass
    finally:
        await admin.close()


async def round_trip(bootstrap: str) -> None:
    topic = "stack-probe"
    payload = uuid.uuid4().bytes
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
    await producer.start()
    try:
        await producer.send_and_wait(topic, payload)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id="stack-probe",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=1000)
            for records in batch.values():
                if any(r.value == payload for r in records):
                    await consumer.commit()
                    return
        raise RuntimeError("probe message did not come back within 30 s")
    finally:
        await consumer.stop()


async def main(bootstrap: str) -> None:
    replication = min(3, len(bootstrap.split(",")))
    deadline = time.monotonic() + 60
    while True:
        try:
            await ensure_topics(bootstrap, replication)
            await round_trip(bootstrap)
            print(f"[stack] kafka ready at {bootstrap} (topics + idempotent round trip)")
            return
        except (KafkaError, OSError) as exc:
            if time.monotonic() > deadline:
                raise
            print(f"[stack] kafka not ready yet: {exc!r}; retrying")
            await asyncio.sleep(2)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "kafka":
        sys.exit("usage: stack_probe.py kafka BOOTSTRAP")
    asyncio.run(main(sys.argv[2]))
