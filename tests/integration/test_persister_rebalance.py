"""Two persisters in one group, one leaves mid-stream: the other takes over, nothing lost."""

from __future__ import annotations

import asyncio

from flashcoupon_persister.bootstrap import running

from tests.conftest import Stack, random_name
from tests.persister_support import (
    codes,
    committed,
    count_rows,
    coupon,
    create_topic,
    delete_topics,
    end_offsets,
    engine_for,
    insert_event,
    produce_coupons,
    read_all,
    settings_for,
    wait_until,
)


async def test_member_leaving_mid_stream_hands_over_without_loss(
    stack: Stack, kafka_topic: str, mysql_url: str
) -> None:
    bootstrap = stack.kafka.bootstrap
    dlq = await create_topic(bootstrap, 1, prefix="dlq")
    engine = engine_for(mysql_url)
    try:
        event = random_name("ev")
        await insert_event(engine, event)
        batch = [coupon(event, n) for n in range(3000)]
        group = random_name("g")
        settings = settings_for(bootstrap, mysql_url, kafka_topic, dlq, group, max_batch=100)

        async def stream() -> None:
            for i in range(0, len(batch), 150):
                await produce_coupons(bootstrap, kafka_topic, batch[i : i + 150])
                await asyncio.sleep(0.2)

        async with running(settings) as a:
            producer = asyncio.create_task(stream())
            async with running(settings) as b:

                async def both_assigned() -> bool:
                    return a.assigned and b.assigned

                assert await wait_until(both_assigned, 30)
                assert await wait_until(lambda: _has_rows(engine, event, 500), 30)
            # b left the group (stop() commits and leaves): a must end up with everything.
            await producer

            async def drained() -> bool:
                return await committed(bootstrap, group, kafka_topic) == await end_offsets(
                    bootstrap, kafka_topic
                )

            assert await wait_until(drained, 60)
            assert len(a.consumer.assignment()) == 3
        assert await count_rows(engine, event) == len(batch)
        assert await codes(engine, event) == sorted(c.code for c in batch)
        assert await read_all(bootstrap, dlq, 1, within=2) == []
    finally:
        await engine.dispose()
        await delete_topics(bootstrap, dlq)


async def _has_rows(engine, event: str, n: int) -> bool:  # type: ignore[no-untyped-def]
    return await count_rows(engine, event) >= n
