"""`make bench-relay`: outbox entries → Kafka records per second (printed, never asserted).

    uv run python -m flashcoupon_loadtest.bench_relay

Writes N entries into a fresh event's outbox first, then times relays draining it into a fresh
6-partition topic (like coupon-issued), and compares with the naive relay the DESIGN.md
pitfalls warn about (send_and_wait per record). FLASHCOUPON_BENCH_RELAY_ENTRIES sets N.
CPU microseconds per record (from /proc) are the figure that does not depend on how busy the
shared machine is; the figures go to loadtest/results/bench-relay.json.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer
from flashcoupon_common.kafka_admin import create_topics
from flashcoupon_common.redis_cluster import create_redis_cluster
from flashcoupon_common.settings import KafkaSettings, RedisSettings
from flashcoupon_relay.relay import Relay

from flashcoupon_loadtest import localrun
from flashcoupon_loadtest.outbox import (
    cleanup_event,
    codes_of,
    make_coupons,
    read_all,
    register,
    relay_settings,
    running,
    wait_drained,
    write_outbox,
)
from flashcoupon_loadtest.procstat import cpu_seconds

RESULTS = Path(__file__).resolve().parents[2] / "results"
N = int(os.environ.get("FLASHCOUPON_BENCH_RELAY_ENTRIES", "50000"))
NAIVE_N = 2000


def random_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def start_relay(
    env: dict[str, str], log: Path, **overrides: str
) -> tuple[subprocess.Popen[bytes], int]:
    """`python -m flashcoupon_relay` on a free port; `overrides` set FLASHCOUPON_RELAY_<KEY>."""
    port = localrun.free_port()
    relay_env = {**env, **{f"FLASHCOUPON_RELAY_{k.upper()}": v for k, v in overrides.items()}}
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flashcoupon_relay", "--port", str(port)],
            env=relay_env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return proc, port


async def _drain_rate(env: dict[str, str], redis: Any, relays: int, n: int, **kw: Any) -> float:
    bootstrap = KafkaSettings.from_env(env).bootstrap
    event_id, topic = random_name("bench"), random_name("t-bench")
    await create_topics(bootstrap, topic, topic + "-dlq", partitions=6)
    try:
        await register(redis, event_id)
        await write_outbox(redis, make_coupons(event_id, n, users=n // 3), chunk=2000)
        instances = [
            Relay(relay_settings(env, event_id, topic, **kw), redis) for _ in range(relays)
        ]
        started = time.perf_counter()
        async with contextlib.AsyncExitStack() as stack_of_relays:
            for relay in instances:
                await stack_of_relays.enter_async_context(running(relay))
            await wait_drained(redis, event_id, within=600)
            elapsed = time.perf_counter() - started
        codes = codes_of(await read_all(bootstrap, topic))
        assert len(set(codes)) == n
        return n / elapsed
    finally:
        await cleanup_event(redis, event_id)


async def _naive_rate(env: dict[str, str], n: int) -> float:
    """What the pitfall looks like: one send_and_wait per record."""
    bootstrap = KafkaSettings.from_env(env).bootstrap
    topic = random_name("t-bench")
    await create_topics(bootstrap, topic, partitions=6)
    coupons = make_coupons(random_name("bench"), n)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
    await producer.start()
    try:
        started = time.perf_counter()
        for c in coupons:
            await producer.send_and_wait(topic, c.encode(), key=c.kafka_key())
        return n / (time.perf_counter() - started)
    finally:
        await producer.stop()


async def _process_rate(
    env: dict[str, str], redis: Any, processes: int, n: int, log: Path
) -> tuple[float, float]:
    """`processes` relay processes on one event; timed from the event's registration."""
    bootstrap = KafkaSettings.from_env(env).bootstrap
    event_id, topic = random_name("bench"), random_name("t-bench")
    await create_topics(bootstrap, topic, topic + "-dlq", partitions=6)
    await write_outbox(redis, make_coupons(event_id, n, users=n // 3), chunk=2000)
    procs = []
    try:
        for i in range(processes):
            over = {"topic": topic, "dlq_topic": topic + "-dlq", "events": event_id}
            over |= {"consumer": f"bench-{i}", "registry_refresh_ms": "100"}
            procs.append(start_relay(env, log, **over))
        for proc, port in procs:
            url = f"http://127.0.0.1:{port}/readyz"
            await asyncio.to_thread(localrun.wait_ready, url, timeout=60, proc=proc)
        cpu_before = sum(cpu_seconds(p.pid) for p, _ in procs)
        started = time.perf_counter()
        await register(redis, event_id)
        await wait_drained(redis, event_id, within=600)
        elapsed = time.perf_counter() - started
        cpu = sum(cpu_seconds(p.pid) for p, _ in procs) - cpu_before
        assert len(set(codes_of(await read_all(bootstrap, topic)))) == n
        return n / elapsed, cpu * 1e6 / n
    finally:
        for proc, _ in procs:
            proc.terminate()
            proc.wait(30)
        await cleanup_event(redis, event_id)


async def main_async() -> None:
    env = {**os.environ, **localrun.stack_env()}
    log = localrun.LOG_DIR / "bench-relay.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    redis = create_redis_cluster(RedisSettings.from_env(env))
    await redis.initialize()
    try:
        naive = await _naive_rate(env, NAIVE_N)
        one = await _drain_rate(env, redis, 1, N, batch_size=1000)
        proc1, cpu1 = await _process_rate(env, redis, 1, N, log)
        proc2, cpu2 = await _process_rate(env, redis, 2, N, log)
    finally:
        await redis.aclose()
    _write_results(
        naive_records_per_s=naive,
        in_process_records_per_s=one,
        one_process_records_per_s=proc1,
        one_process_cpu_us_per_record=cpu1,
        two_processes_records_per_s=proc2,
        two_processes_cpu_us_per_record=cpu2,
        ratio_relay_vs_naive=proc1 / naive,
        ratio_two_vs_one_process=proc2 / proc1,
    )
    print(f"\nrelay throughput, {N} entries, one event stream, 6 partitions, load {_load()}")
    print(f"  naive send_and_wait per record : {naive:8.0f} records/s ({NAIVE_N} records)")
    print(f"  relay in-process, batch 1000   : {one:8.0f} records/s ({one / naive:.1f}x naive)")
    print(
        f"  1 relay process                : {proc1:8.0f} records/s ({proc1 / naive:.1f}x naive)"
        f", {cpu1:.0f} CPU-us/record (ceiling {1e6 / cpu1:.0f}/s per core)"
    )
    print(
        f"  2 relay processes              : {proc2:8.0f} records/s ({proc2 / proc1:.2f}x one)"
        f", {cpu2:.0f} CPU-us/record"
    )


def _write_results(**figures: float) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    body = {
        "benchmark": "relay",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "load": os.getloadavg()},
        "entries": N,
        "partitions": 6,
        **{k: round(v, 2) for k, v in figures.items()},
    }
    (RESULTS / "bench-relay.json").write_text(json.dumps(body, indent=2) + "\n")


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg()) + f" on {os.cpu_count()} cpus"


def main() -> None:
    asyncio.run(main_async())


if __name__ == "__main__":
    main()
