"""Poison records mid-partition go to the DLQ with the reason; the partition moves on."""

from __future__ import annotations

from flashcoupon_persister import metrics
from flashcoupon_persister.bootstrap import running
from flashcoupon_persister.replay import replay
from sqlalchemy.ext.asyncio import create_async_engine

from tests.conftest import Stack, random_name
from tests.persister_support import (
    codes,
    committed,
    count_rows,
    coupon,
    create_topic,
    delete_topics,
    end_offsets,
    insert_event,
    produce,
    read_all,
    settings_for,
    wait_until,
)


async def test_poison_goes_to_dlq_and_later_records_are_persisted(
    stack: Stack, mysql_url: str
) -> None:
    bootstrap = stack.kafka.bootstrap
    topic = await create_topic(bootstrap, 1)
    dlq = await create_topic(bootstrap, 1, prefix="dlq")
    engine = create_async_engine(mysql_url)
    try:
        event = random_name("ev")
        await insert_event(engine, event)
        good = [coupon(event, n) for n in range(10)]
        wrong_version = good[0].encode().replace(b'"v":1', b'"v":2')
        code_clash = coupon(event, 50, code=good[1].code)  # another user claims good[1]'s code
        no_catalog = coupon(random_name("nocat"), 51)  # its event has no coupon_events row
        items = [(c.kafka_key(), c.encode()) for c in good[:5]]
        items += [
            (b"u-x", b"\x00not json at all"),  # offset 5
            (b"u-y", wrong_version),  # offset 6
            (code_clash.kafka_key(), code_clash.encode()),  # offset 7
            (no_catalog.kafka_key(), no_catalog.encode()),  # offset 8
        ]
        items += [(c.kafka_key(), c.encode()) for c in good[5:]]
        await produce(bootstrap, topic, items, partition=0)

        group = random_name("g")
        before = metrics.DLQ.labels("schema")._value.get()
        async with running(settings_for(bootstrap, mysql_url, topic, dlq, group)):

            async def drained() -> bool:
                return await committed(bootstrap, group, topic) == await end_offsets(
                    bootstrap, topic
                )

            assert await wait_until(drained, 60)
        assert await committed(bootstrap, group, topic) == {0: 14}
        assert await count_rows(engine, event) == 10
        assert await codes(engine, event) == sorted(c.code for c in good)
        assert metrics.DLQ.labels("schema")._value.get() - before == 2

        letters = await read_all(bootstrap, dlq, 4, within=20)
        got = sorted(
            (
                int(dict(r.headers)["original-offset"]),
                dict(r.headers)["reason"].decode(),
                dict(r.headers)["error-code"].decode(),
            )
            for r in letters
        )
        assert got == [
            (5, "schema", "SCHEMA_ERROR"),
            (6, "schema", "SCHEMA_ERROR"),
            (7, "conflict", "CODE_CONFLICT"),
            (8, "constraint", "MYSQL_1452"),
        ]
        by_offset = {int(dict(r.headers)["original-offset"]): r for r in letters}
        # The original bytes and key are kept, so a fixed record can be replayed as is.
        assert by_offset[6].value == wrong_version and by_offset[6].key == b"u-y"
        assert dict(by_offset[7].headers)["original-topic"] == topic.encode()
        assert dict(by_offset[7].headers)["original-partition"] == b"0"
        assert by_offset[7].value == code_clash.encode()
    finally:
        await engine.dispose()
        await delete_topics(bootstrap, topic, dlq)


async def test_dead_letter_replayed_after_the_fix_is_persisted(
    stack: Stack, mysql_url: str
) -> None:
    """A record dead-lettered for a missing catalog row is stored once the row exists."""
    bootstrap = stack.kafka.bootstrap
    topic = await create_topic(bootstrap, 1)
    dlq = await create_topic(bootstrap, 1, prefix="dlq")
    engine = create_async_engine(mysql_url)
    try:
        late_event = random_name("late")  # its catalog row arrives after its coupons
        orphans = [coupon(late_event, n) for n in range(3)]
        junk = [(b"k", b"not json")]
        await produce(bootstrap, topic, [*junk, *((c.kafka_key(), c.encode()) for c in orphans)])
        group = random_name("g")
        settings = settings_for(bootstrap, mysql_url, topic, dlq, group)
        async with running(settings):
            assert len(await read_all(bootstrap, dlq, 4, within=30)) == 4
            assert await count_rows(engine, late_event) == 0

            listing = await replay(settings.kafka, dlq)  # list only
            assert (listing.scanned, listing.replayed) == (4, 0)
            assert listing.by_code == {"SCHEMA_ERROR": 1, "MYSQL_1452": 3}

            await insert_event(engine, late_event)
            done = await replay(settings.kafka, dlq, code="MYSQL_1452", apply=True)
            assert (done.matched, done.replayed, done.end_offsets) == (3, 3, {0: 4})

            async def stored() -> bool:
                return await count_rows(engine, late_event) == 3

            assert await wait_until(stored, 30)
        assert await codes(engine, late_event) == sorted(c.code for c in orphans)
        # Nothing new was dead-lettered by the replay.
        assert len(await read_all(bootstrap, dlq, 5, within=3)) == 4
    finally:
        await engine.dispose()
        await delete_topics(bootstrap, topic, dlq)
