"""Kafka topic administration for the local stack, the tests and the benchmarks.

The services never create topics (in production the platform provisions them); these are the
few admin calls the project's own tooling needs, written once.
"""

from __future__ import annotations

from aiokafka.admin import AIOKafkaAdminClient, NewTopic


async def create_topics(
    bootstrap: str, *names: str, partitions: int = 3, replication_factor: int = 1
) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics(
            [
                NewTopic(n, num_partitions=partitions, replication_factor=replication_factor)
                for n in names
            ]
        )
    finally:
        await admin.close()


async def delete_topics(bootstrap: str, *names: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_topics(list(names))
    finally:
        await admin.close()


async def committed_offsets(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """The consumer group's committed offset per partition of `topic` (-1: none yet)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        offsets = await admin.list_consumer_group_offsets(group)
    finally:
        await admin.close()
    return {tp.partition: meta.offset for tp, meta in offsets.items() if tp.topic == topic}
