"""`make bench-persister`: rows/s into MariaDB through the real persister vs a plain executemany.

    uv run python -m flashcoupon_loadtest.bench_persister [--records 200000] [--batch 4000]
        [--concurrency 4]

1. Produces N CouponIssued records to a fresh 6-partition topic (a backlog, as after a burst).
2. Runs the persister (real consumer, writer, commits) on a fresh migrated database and
   measures the time until every offset is committed (lag 0) and the sustained rows/s (the
   rate between 10 % and 90 % of the rows, sampled every 250 ms).
3. The ceiling: the same rows through a plain `cursor.executemany` of INSERT into another fresh
   database, one commit per chunk, no Kafka, no decoding, no duplicate checks — on one
   connection (the target's reference), and again on as many connections as the persister
   writes with (the fairer comparison, also reported).
Prints the ratio and writes loadtest/results/bench-persister.json. Uses the local stack
(FLASHCOUPON_KAFKA_BOOTSTRAP / FLASHCOUPON_MYSQL_URL); fresh names, dropped afterwards.

Over 300 lines on purpose: a benchmark script read top to bottom — its fixtures (topic,
databases, records), the persister run and the ceiling run — which nothing else imports.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer
from flashcoupon_common.db.migrate import upgrade
from flashcoupon_common.kafka_admin import committed_offsets, create_topics, delete_topics
from flashcoupon_common.messages import CouponIssued, Discount
from flashcoupon_common.settings import KafkaSettings, MysqlSettings
from flashcoupon_persister import metrics
from flashcoupon_persister.bootstrap import running
from flashcoupon_persister.rows import INSERT_SQL, to_row
from flashcoupon_persister.settings import PersisterSettings
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

RESULTS = Path(__file__).resolve().parents[2] / "results"
PARTITIONS = 6


def make_coupons(event_id: str, n: int) -> list[CouponIssued]:
    """Realistic keys: codes are pseudo-random (the issuer's are Feistel-permuted) and user
    ids arbitrary, so both the persister and the ceiling insert in random index order."""
    now = int(time.time() * 1000)
    rng = random.Random(n)
    codes = {f"{rng.getrandbits(60):015X}" for _ in range(n)}
    while len(codes) < n:
        codes.add(f"{rng.getrandbits(60):015X}")
    return [
        CouponIssued(
            event_id=event_id,
            user_id=f"u-{rng.getrandbits(64):016x}-{i}",
            seq=1,
            code=code,
            tier="big" if i % 10 == 0 else "small",
            discount=Discount("fixed", amount=10000)
            if i % 10 == 0
            else Discount("percent", percent=5, max_amount=3000),
            issued_at_ms=now + i,
            expires_at_ms=now + i + 720 * 3600 * 1000,
            request_id=uuid.uuid4().hex,
        )
        for i, code in enumerate(codes)
    ]


async def fresh_database(base_url: str, name: str, event_id: str) -> tuple[str, AsyncEngine]:
    admin = create_async_engine(base_url)
    async with admin.begin() as conn:
        await conn.execute(text(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4"))
    await admin.dispose()
    url = make_url(base_url).set(database=name).render_as_string(hide_password=False)
    await asyncio.to_thread(upgrade, url)
    engine = create_async_engine(url, pool_size=2)
    async with engine.begin() as conn:
        await conn.execute(
            text(
                "INSERT INTO coupon_events (id, title, quantity, per_user_limit, start_at,"
                " end_at, valid_for_seconds, spec) VALUES (:id, 'bench', 10000000, 1,"
                " NOW(3), NOW(3) + INTERVAL 1 DAY, 2592000, '{}')"
            ),
            {"id": event_id},
        )
    return url, engine


async def drop_database(base_url: str, name: str) -> None:
    admin = create_async_engine(base_url)
    async with admin.begin() as conn:
        await conn.execute(text(f"DROP DATABASE IF EXISTS `{name}`"))
    await admin.dispose()


async def produce(bootstrap: str, topic: str, coupons: list[CouponIssued]) -> float:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        enable_idempotence=True,
        linger_ms=20,
        max_batch_size=512 * 1024,
        compression_type=None,
    )
    await producer.start()
    started = time.perf_counter()
    try:
        for i in range(0, len(coupons), 5000):
            futures = [
                await producer.send(topic, value=c.encode(), key=c.kafka_key())
                for c in coupons[i : i + 5000]
            ]
            await asyncio.gather(*futures)
    finally:
        await producer.stop()
    return time.perf_counter() - started


async def committed_total(bootstrap: str, group: str, topic: str) -> int:
    offsets = await committed_offsets(bootstrap, group, topic)
    return sum(max(0, offset) for offset in offsets.values())


async def count(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        return int((await conn.execute(text("SELECT COUNT(*) FROM user_coupons"))).scalar_one())


def sustained_rate(samples: list[tuple[float, int]], total: int) -> float:
    """Rows/s between the samples where 10 % and 90 % of the rows were in."""
    lo = next((s for s in samples if s[1] >= total * 0.1), None)
    hi = next((s for s in samples if s[1] >= total * 0.9), None)
    if lo is None or hi is None or hi[0] <= lo[0]:
        return 0.0
    return (hi[1] - lo[1]) / (hi[0] - lo[0])


async def run_persister(
    bootstrap: str,
    url: str,
    engine: AsyncEngine,
    topic: str,
    total: int,
    batch: int,
    concurrency: int,
) -> dict[str, Any]:
    group = f"bench-{uuid.uuid4().hex[:8]}"
    settings = PersisterSettings(
        kafka=KafkaSettings(bootstrap),
        mysql=MysqlSettings(url),
        group_id=group,
        topic=topic,
        dlq_topic=f"{topic}-dlq",
        max_batch=batch,
        max_wait_ms=100,
        write_concurrency=concurrency,
        db_pool_size=concurrency + 2,
    )
    samples: list[tuple[float, int]] = []
    inserted = metrics.ROWS.labels("inserted")
    base = inserted._value.get()
    started = time.perf_counter()
    async with running(settings) as loop:
        while True:
            await asyncio.sleep(0.25)
            # The writer's own counter: a COUNT(*) here would compete with the inserts.
            rows = int(inserted._value.get() - base)
            samples.append((time.perf_counter() - started, rows))
            if rows >= total and await committed_total(bootstrap, group, topic) >= total:
                break
            if time.perf_counter() - started > 900:
                raise RuntimeError(f"persister did not drain: {rows}/{total} rows")
        lag_zero_s = time.perf_counter() - started
        batches = loop.batches_done
    return {
        "lag_zero_seconds": round(lag_zero_s, 2),
        "rows_per_s_overall": round(total / lag_zero_s),
        "rows_per_s_sustained": round(sustained_rate(samples, total)),
        "batches": batches,
        "mean_batch": round(total / max(1, batches)),
    }


async def run_ceiling(
    url: str, coupons: list[CouponIssued], chunk: int, connections: int = 1
) -> dict[str, Any]:
    """Plain executemany on raw driver connections: the most a writer could hope for.

    Rows are prepared up front and chunks handed out from a queue, one commit per chunk: no
    Kafka, no decoding, no duplicate checks, so this measures the database alone.
    """
    engine = create_async_engine(url, pool_size=connections)
    rows = [to_row(c) for c in coupons]
    plain = INSERT_SQL.split(" ON DUPLICATE")[0]
    chunks: asyncio.Queue[list[tuple[Any, ...]]] = asyncio.Queue()
    for i in range(0, len(rows), chunk):
        chunks.put_nowait(rows[i : i + chunk])

    async def worker() -> None:
        async with engine.connect() as conn:
            driver = (await conn.get_raw_connection()).driver_connection
            assert driver is not None
            while not chunks.empty():
                part = chunks.get_nowait()
                async with driver.cursor() as cur:
                    await cur.executemany(plain, part)
                await driver.commit()

    try:
        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(connections)))
        elapsed = time.perf_counter() - started
        n = await count(engine)
    finally:
        await engine.dispose()
    assert n == len(coupons), (n, len(coupons))
    return {
        "connections": connections,
        "seconds": round(elapsed, 2),
        "rows_per_s": round(len(rows) / elapsed),
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    kafka = KafkaSettings.from_env()
    mysql = MysqlSettings.from_env()
    tag = uuid.uuid4().hex[:8]
    event_id = f"bench-{tag}"
    topic = f"bench-persister-{tag}"
    coupons = make_coupons(event_id, args.records)
    await create_topics(kafka.bootstrap, topic, partitions=PARTITIONS)
    await create_topics(kafka.bootstrap, f"{topic}-dlq", partitions=1)
    dbs = [f"bench_persister_{tag}", f"bench_ceiling_{tag}", f"bench_ceiling_c_{tag}"]
    try:
        print(f"producing {args.records} records to {topic} ...", flush=True)
        produce_s = await produce(kafka.bootstrap, topic, coupons)
        print(f"  produced in {produce_s:.1f}s", flush=True)
        url, engine = await fresh_database(mysql.url, dbs[0], event_id)
        try:
            print("persister: consuming the backlog into MariaDB ...", flush=True)
            persister = await run_persister(
                kafka.bootstrap, url, engine, topic, args.records, args.batch, args.concurrency
            )
            assert await count(engine) == args.records
        finally:
            await engine.dispose()
        print(f"  {persister}", flush=True)
        url2, engine2 = await fresh_database(mysql.url, dbs[1], event_id)
        await engine2.dispose()
        print("ceiling: plain executemany of the same rows, one connection ...", flush=True)
        ceiling = await run_ceiling(url2, coupons, args.batch)
        print(f"  {ceiling}", flush=True)
        url3, engine3 = await fresh_database(mysql.url, dbs[2], event_id)
        await engine3.dispose()
        conc = args.concurrency
        print(f"ceiling: the same over {conc} connections (as the persister) ...", flush=True)
        ceiling_c = await run_ceiling(url3, coupons, args.batch, connections=conc)
        print(f"  {ceiling_c}", flush=True)
    finally:
        await delete_topics(kafka.bootstrap, topic, f"{topic}-dlq")
        for db in dbs:
            await drop_database(mysql.url, db)
    ratio = persister["rows_per_s_sustained"] / ceiling["rows_per_s"]
    ratio_c = persister["rows_per_s_sustained"] / ceiling_c["rows_per_s"]
    return {
        "benchmark": "persister",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "records": args.records,
        "batch": args.batch,
        "write_concurrency": args.concurrency,
        "partitions": PARTITIONS,
        "produce_seconds": round(produce_s, 2),
        "persister": persister,
        "ceiling_executemany": ceiling,
        "ceiling_executemany_same_concurrency": ceiling_c,
        "ratio_sustained_to_ceiling": round(ratio, 3),
        "ratio_sustained_to_same_concurrency_ceiling": round(ratio_c, 3),
        "targets": {"rows_per_s": 30000, "ratio": 0.25},
        "meets_targets": persister["rows_per_s_sustained"] >= 30000 and ratio >= 0.25,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument(
        "--batch", type=int, default=PersisterSettings.max_batch, help="persister max batch"
    )
    parser.add_argument(
        "--concurrency",
        type=int,
        default=PersisterSettings.write_concurrency,
        help="persister write concurrency",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "bench-persister.json")
    args = parser.parse_args()
    result = asyncio.run(main_async(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    p, c = result["persister"], result["ceiling_executemany"]
    cc = result["ceiling_executemany_same_concurrency"]
    print(
        f"\npersister sustained {p['rows_per_s_sustained']:,} rows/s "
        f"(overall {p['rows_per_s_overall']:,}; lag 0 after {p['lag_zero_seconds']}s)\n"
        f"ceiling executemany {c['rows_per_s']:,} rows/s (1 connection), "
        f"{cc['rows_per_s']:,} rows/s ({cc['connections']} connections)\n"
        f"ratio {result['ratio_sustained_to_ceiling']:.2f} "
        f"(vs {cc['connections']} connections: "
        f"{result['ratio_sustained_to_same_concurrency_ceiling']:.2f})  "
        f"(targets: >= 30,000 rows/s and >= 0.25) -> "
        f"{'MET' if result['meets_targets'] else 'NOT MET'}\nwritten {args.out}"
    )


if __name__ == "__main__":
    main()
