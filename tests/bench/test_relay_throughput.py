"""Relay throughput: outbox entries → Kafka records per second (printed, never asserted).

    make bench-relay    (or: uv run pytest tests/bench/test_relay_throughput.py -s -q)

Writes N entries into a fresh event's outbox first, then times relays draining it into a fresh
6-partition topic (like coupon-issued), and compares with the naive relay the DESIGN.md
pitfalls warn about (send_and_wait per record). FLASHCOUPON_BENCH_RELAY_ENTRIES sets N.
CPU microseconds per record (from /proc) are the figure that does not depend on how busy the
shared machine is; the figures go to loadtest/results/bench-relay.json.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
from aiokafka import AIOKafkaProducer
from flashcoupon_common.kafka_admin import create_topics
from flashcoupon_relay.relay import Relay

from tests.conftest import random_name
from tests.e2e.test_relay_sigkill import start_relay
from tests.integration.test_relay_pipeline import (
    cleanup_event,
    codes_of,
    make_coupons,
    outbox_drained,
    read_all,
    register,
    relay_settings,
    running,
    wait_until,
    write_outbox,
)

RESULTS = Path(__file__).resolve().parents[2] / "loadtest" / "results"
N = int(os.environ.get("FLASHCOUPON_BENCH_RELAY_ENTRIES", "50000"))
NAIVE_N = 2000


async def _drain_rate(stack, redis, relays: int, n: int, **kw) -> float:
    event_id, topic = random_name("bench"), random_name("t-bench")
    await create_topics(stack.kafka.bootstrap, topic, topic + "-dlq", partitions=6)
    try:
        await register(redis, event_id)
        await write_outbox(redis, make_coupons(event_id, n, users=n // 3), chunk=2000)
        instances = [
            Relay(relay_settings(stack.env(), event_id, topic, **kw), redis) for _ in range(relays)
        ]
        started = time.perf_counter()
        async with contextlib.AsyncExitStack() as stack_of_relays:
            for relay in instances:
                await stack_of_relays.enter_async_context(running(relay))
            await wait_until(lambda: outbox_drained(redis, event_id), within=600, interval=0.05)
            elapsed = time.perf_counter() - started
        codes = codes_of(await read_all(stack.kafka.bootstrap, topic))
        assert len(set(codes)) == n
        return n / elapsed
    finally:
        await cleanup_event(redis, event_id)


async def _naive_rate(stack, n: int) -> float:
    """What the pitfall looks like: one send_and_wait per record."""
    topic = random_name("t-bench")
    await create_topics(stack.kafka.bootstrap, topic, partitions=6)
    coupons = make_coupons(random_name("bench"), n)
    producer = AIOKafkaProducer(bootstrap_servers=stack.kafka.bootstrap, enable_idempotence=True)
    await producer.start()
    try:
        started = time.perf_counter()
        for c in coupons:
            await producer.send_and_wait(topic, c.encode(), key=c.kafka_key())
        return n / (time.perf_counter() - started)
    finally:
        await producer.stop()


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc): the load-independent cost."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _process_rate(stack, redis, processes: int, n: int, tmp: Path) -> tuple[float, float]:
    """`processes` relay processes on one event; timed from the event's registration."""
    event_id, topic = random_name("bench"), random_name("t-bench")
    await create_topics(stack.kafka.bootstrap, topic, topic + "-dlq", partitions=6)
    await write_outbox(redis, make_coupons(event_id, n, users=n // 3), chunk=2000)
    procs = []
    try:
        for i in range(processes):
            env = {"topic": topic, "dlq_topic": topic + "-dlq", "events": event_id}
            env |= {"consumer": f"bench-{i}", "registry_refresh_ms": "100"}
            procs.append(start_relay(stack.env(), tmp / "relays.log", **env))
        async with httpx.AsyncClient() as http:
            for _, port in procs:
                await wait_until(lambda p=port: _ready(http, p), within=60, what="relay ready")
        cpu_before = sum(_cpu_seconds(p.pid) for p, _ in procs)
        started = time.perf_counter()
        await register(redis, event_id)
        await wait_until(lambda: outbox_drained(redis, event_id), within=600, interval=0.05)
        elapsed = time.perf_counter() - started
        cpu = sum(_cpu_seconds(p.pid) for p, _ in procs) - cpu_before
        assert len(set(codes_of(await read_all(stack.kafka.bootstrap, topic)))) == n
        return n / elapsed, cpu * 1e6 / n
    finally:
        for proc, _ in procs:
            proc.terminate()
            proc.wait(30)
        await cleanup_event(redis, event_id)


async def _ready(http: httpx.AsyncClient, port: int) -> bool:
    try:
        return (await http.get(f"http://127.0.0.1:{port}/readyz")).status_code == 200
    except httpx.HTTPError:
        return False


async def test_relay_throughput(stack, redis_cluster, tmp_path) -> None:
    naive = await _naive_rate(stack, NAIVE_N)
    one = await _drain_rate(stack, redis_cluster, 1, N, batch_size=1000)
    proc1, cpu1 = await _process_rate(stack, redis_cluster, 1, N, tmp_path)
    proc2, cpu2 = await _process_rate(stack, redis_cluster, 2, N, tmp_path)
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
