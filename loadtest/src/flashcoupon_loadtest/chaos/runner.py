"""One chaos row end to end: event, services, burst + fault, retries, drain, check.

A row gets a fresh event (its own id, Kafka topic and persister group) on the shared private
stack and a fresh set of service processes (2 gateways, 2 issuers, relay(s), persister(s)),
so rows never see each other's traffic. The stack is made healthy again before each row
(`stack.sh up` restarts whatever a previous row left dead and waits for the Redis Cluster to
be whole with every replica linked).

Timeline on the workload's clock: burst starts at 0; the fault is injected at `warm`; after
`hold` seconds it is recovered (restart / resume), which ends the fault; the burst goes on
for `after` seconds more. Then undecided shoppers retry, the pipeline drains, and both stores
are read directly.

Over 300 lines: `run_row` is one sequence whose set-up (the row's own Kafka, proxies, clock)
and tear-down must stay side by side in one try/finally; splitting it would scatter that.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import math
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from flashcoupon_common import event_state, keys
from flashcoupon_common.db.engine import create_engine
from flashcoupon_common.event_spec import EventSpec, TierSpec
from flashcoupon_common.kafka_admin import create_topics
from flashcoupon_common.messages import Discount
from flashcoupon_common.redis_cluster import create_redis_cluster
from flashcoupon_common.settings import MysqlSettings, RedisSettings

from flashcoupon_loadtest.chaos.checker import Figures, judge
from flashcoupon_loadtest.chaos.faults import Fault, Timing
from flashcoupon_loadtest.chaos.stack import PrivateStack
from flashcoupon_loadtest.chaos.toxi import KafkaProxy, RedisProxies, Toxiproxy, Unavailable
from flashcoupon_loadtest.chaos.workload import Plan, Workload
from flashcoupon_loadtest.invariants import (
    check_event,
    persisted_count,
    read_mysql,
    read_redis,
)
from flashcoupon_loadtest.localrun import LocalServices, Service, wait_ready

SUPPLY = 0.8  # coupons per shopper: the event sells out near the end of the burst
# The harness's own reads and writes are bounded by the clients' read timeouts (Redis
# socket_timeout, asyncmy read_timeout), never by cancelling them: on Python 3.11 a cancelled
# redis-py or asyncmy call can swallow the cancellation and wait forever on its connection
# (reproduced here with asyncio.wait_for around read_state and a COUNT(*); a CI run hung 900 s
# in relay-kill-survivor, whose samplers cancelled such reads once a second on a slow box).
# flashcoupon_common.probes says the same of the services' readiness checks.
HARNESS_IO_S = 30.0


class ChaosServices(LocalServices):
    """LocalServices whose processes a fault may kill and an operator restart."""

    def by_name(self, name: str) -> Service:
        return next(s for s in self.services if s.name == name)

    def kill(self, name: str) -> None:
        s = self.by_name(name)
        assert s.proc is not None
        s.proc.kill()
        s.proc.wait(timeout=10)

    def restart(self, name: str) -> None:
        s = self.by_name(name)
        if s.log is not None:
            s.log.close()
        self._spawn(s)
        wait_ready(f"{s.url}/readyz", timeout=self.ready_timeout, proc=s.proc)


@dataclass
class RowContext:
    stack: PrivateStack
    services: ChaosServices
    master: str  # redis-<port> owning the event's slot when the row began
    proxies: Toxiproxy | None = None


@dataclass
class RowResult:
    fault: Fault
    event_id: str
    figures: Figures | None
    timeline: dict[str, float]
    drain_s: float | None
    invariants: list[dict[str, Any]]
    error: str | None
    logs: str

    @property
    def failures(self) -> list[str]:
        if self.figures is None:
            return ["error"]
        found = self.figures.failures(self.fault.allowed)
        if self.drain_s is None:
            found.append("not drained")
        return found

    @property
    def verdict(self) -> str:
        if self.error is not None and self.error.startswith("SKIP"):
            return "SKIP"
        if self.failures:
            return "FAIL"
        if self.figures is not None and self.figures.failures():
            return "PASS*"  # only documented, allowed categories occurred
        return "PASS"

    def to_json(self) -> dict[str, Any]:
        return {
            "row": self.fault.name,
            "fault": self.fault.what,
            "durability": self.fault.durability,
            "allowed": list(self.fault.allowed),
            "verdict": self.verdict,
            "failures": self.failures,
            "event_id": self.event_id,
            "timeline_s": self.timeline,
            "drain_s": self.drain_s,
            "figures": self.figures.to_json() if self.figures else None,
            "invariants": self.invariants,
            "error": self.error,
            "logs": self.logs,
        }


async def heal(stack: PrivateStack) -> None:
    """Restart whatever a previous row left dead; fail loudly if the stack stays unhealthy."""
    ok, status = await asyncio.to_thread(stack.healthy)
    if not ok:
        await asyncio.to_thread(stack.start)
        ok, status = await asyncio.to_thread(stack.healthy)
    if not ok:
        raise RuntimeError(f"private stack unhealthy before the row:\n{status}")


def _spec(event_id: str, quantity: int) -> EventSpec:
    now = datetime.now(UTC)
    return EventSpec(
        event_id=event_id,
        title="chaos",
        quantity=quantity,
        start_at=now - timedelta(seconds=5),
        end_at=now + timedelta(hours=1),
        tiers=(TierSpec("all", Discount("fixed", amount=500), 100),),
    )


async def _retrying(what: str, call: Any, within: float = 60.0) -> Any:
    """Reads during/after a failover: retry until the cluster answers (each try is bounded by
    the clients' read timeouts)."""
    deadline = time.monotonic() + within
    while True:
        try:
            return await call()
        except Exception as exc:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{what}: {exc!r}") from exc
            await asyncio.sleep(0.5)


@dataclass
class Progress:
    """Where a row is, so a row that overruns its deadline says where it stuck."""

    event_id: str
    stage: str = "heal the stack"
    timeline: dict[str, float] = field(default_factory=dict)

    def at(self, stage: str) -> None:
        self.stage = stage


def _dump_stacks(path: Path, progress: Progress) -> None:
    """What every task and thread was doing as the row's deadline came (before it unwinds)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        f.write(f"stuck in: {progress.stage}\n\n--- asyncio tasks\n")
        for task in asyncio.all_tasks():
            task.print_stack(file=f)
        f.write("\n--- threads\n")
        f.flush()
        faulthandler.dump_traceback(f, all_threads=True)
    sys.stderr.write(f"[chaos] row stuck in {progress.stage}; stacks ({path}):\n")
    sys.stderr.write(path.read_text()[-6000:])
    sys.stderr.flush()


async def run_row(
    stack: PrivateStack, fault: Fault, timing: Timing, log_root: Path, budget: float | None = None
) -> RowResult:
    """One row within its deadline (`Timing.row_budget` unless `budget`): a row that overruns
    it is reported as stuck, every task's and thread's stack in its log directory, and the run
    goes on with the next row."""
    progress = Progress(f"chaos-{fault.name}-{secrets.token_hex(3)}")
    log_dir = log_root / fault.name
    if budget is None:
        budget = timing.row_budget(fault.hold_seconds(timing))
    dump = asyncio.get_running_loop().call_later(
        budget * 0.95, _dump_stacks, log_dir / "stuck.txt", progress
    )
    try:
        async with asyncio.timeout(budget) as deadline:
            return await _run_row(stack, fault, timing, log_dir, progress)
    except TimeoutError:
        if not deadline.expired():
            raise
        return RowResult(
            fault,
            progress.event_id,
            None,
            progress.timeline,
            None,
            [],
            f"stuck in {progress.stage}: the row overran its {budget:.0f} s deadline "
            f"(stacks in {log_dir / 'stuck.txt'})",
            str(log_dir),
        )
    finally:
        dump.cancel()


async def _run_row(
    stack: PrivateStack, fault: Fault, timing: Timing, log_dir: Path, progress: Progress
) -> RowResult:
    await heal(stack)
    progress.at("provision the event")
    event_id = progress.event_id
    hold = fault.hold_seconds(timing)
    shoppers = math.ceil(timing.rate * timing.burst_seconds(hold))
    quantity = int(shoppers * SUPPLY)
    env = stack.service_env()
    topic = f"{event_id}-issued"
    redis = create_redis_cluster(RedisSettings.from_env(env), socket_timeout=HARNESS_IO_S)
    engine = create_engine(MysqlSettings.from_env(env), pool_size=2, read_timeout_s=HARNESS_IO_S)
    gateway_env: dict[str, str] = {
        "FLASHCOUPON_GATEWAY_IP_PER_SECOND": "1000",
        "FLASHCOUPON_GATEWAY_IP_BURST": "1000",
    }
    timeline = progress.timeline
    services: ChaosServices | None = None
    proxies: Toxiproxy | None = None
    issuer_env = {"FLASHCOUPON_ISSUER_DURABILITY": fault.durability, **fault.issuer_env}
    relay_env: dict[str, str] = {}
    try:
        if fault.issuer_clock:
            issuer_env.update(faketime_env(fault.issuer_clock))
        await redis.initialize()
        spec = _spec(event_id, quantity)
        await event_state.provision(redis, spec)
        await _catalog(engine, spec)
        if fault.gateway_redis:
            gw = await asyncio.to_thread(stack.start_gateway_redis)
            gw_redis = create_redis_cluster(
                RedisSettings.from_env({"FLASHCOUPON_REDIS_NODES": gw.redis_nodes_setting})
            )
            try:  # the gateway reads the event's admission settings from its own Redis
                await gw_redis.initialize()
                await event_state.provision(gw_redis, _spec(event_id, quantity))
            finally:
                await gw_redis.aclose()
            gateway_env["FLASHCOUPON_REDIS_NODES"] = gw.redis_nodes_setting
        progress.at("create the topic")
        if fault.kafka_brokers > 1:
            k3 = await asyncio.to_thread(stack.start_kafka3)
            env = {**env, "FLASHCOUPON_KAFKA_BOOTSTRAP": k3.kafka_bootstrap}
            await create_topics(k3.kafka_bootstrap, topic, partitions=6, replication_factor=3)
        else:
            await create_topics(stack.kafka_bootstrap, topic, partitions=6)
        if fault.redis_proxy:
            proxies = RedisProxies(stack, log_dir)
            await asyncio.to_thread(proxies.start)
        elif fault.kafka_proxy:
            kafka_proxy = proxies = KafkaProxy(stack, log_dir)
            await asyncio.to_thread(proxies.start)
            relay_env["FLASHCOUPON_KAFKA_BOOTSTRAP"] = kafka_proxy.bootstrap
        progress.at("start the services")
        services = ChaosServices(
            wallet=False,
            relays=fault.relays,
            persisters=fault.persisters,
            env=env,
            log_dir=log_dir,
            per_service_env={
                "issuer": issuer_env,
                "gateway": gateway_env,
                "relay": {
                    "FLASHCOUPON_RELAY_EVENTS": event_id,
                    "FLASHCOUPON_RELAY_TOPIC": topic,
                    # A dead relay's pending entries are claimed after 5 s, not 30 s.
                    "FLASHCOUPON_RELAY_CLAIM_IDLE_MS": "5000",
                    "FLASHCOUPON_RELAY_CLAIM_INTERVAL_MS": "1000",
                    # The same setting as the issuer's: publish only what a replica holds.
                    "FLASHCOUPON_RELAY_DURABILITY": fault.durability,
                    **relay_env,
                },
                "persister": {
                    "FLASHCOUPON_PERSISTER_TOPIC": topic,
                    "FLASHCOUPON_PERSISTER_GROUP_ID": f"{event_id}-persister",
                },
            },
        )
        await asyncio.to_thread(services.start)
        node = redis.nodes_manager.get_node_from_slot(redis.keyslot(keys.config_key(event_id)))
        port = int(node.port)
        proxy_of = proxies.proxy_of if isinstance(proxies, RedisProxies) else {}
        real = {v: k for k, v in proxy_of.items()}
        ctx = RowContext(stack, services, f"redis-{real.get(port, port)}", proxies)
        plan = Plan(event_id, shoppers, timing.rate, prefix=f"u{secrets.token_hex(2)}")

        async with Workload(plan, services.gateway_urls) as load:
            samples: list[tuple[float, int]] = []  # (time, Redis issued counter)
            persisted: list[tuple[float, int]] = []  # (time, MySQL rows)

            sampling = asyncio.Event()  # cleared: the samplers end after their current read
            sampling.set()

            async def sample() -> None:
                while sampling.is_set():
                    t = load.now()
                    with contextlib.suppress(Exception):
                        state = await event_state.read_state(redis, event_id)
                        if state is not None:
                            samples.append((t, state.issued))
                    await asyncio.sleep(0.2)

            async def sample_mysql() -> None:
                while sampling.is_set():
                    t = load.now()
                    with contextlib.suppress(Exception):
                        rows = await persisted_count(engine, event_id)
                        persisted.append((t, rows))
                    await asyncio.sleep(0.25)

            async def inject() -> None:
                await asyncio.sleep(timing.warm)
                timeline["fault_start"] = load.now()
                await fault.inject(ctx)
                timeline["injected"] = load.now()
                if fault.recover is not None:
                    await asyncio.sleep(hold)
                    timeline["recover_start"] = load.now()
                    await fault.recover(ctx)
                timeline["fault_end"] = load.now()

            samplers = [asyncio.create_task(sample()), asyncio.create_task(sample_mysql())]
            try:
                progress.at("the burst and the fault")
                await asyncio.gather(load.burst(), inject())
                timeline["burst_end"] = load.now()
                progress.at("retries of undecided shoppers")
                await load.retry_undecided(timing.retry)
                timeline["retries_end"] = load.now()
                progress.at("the drain (MySQL = Redis)")
                drained_at = await _drain(redis, engine, event_id, timing.drain)
                drain_s = None
                if drained_at is not None:
                    drain_s = round(drained_at - load.t0 - timeline["retries_end"], 2)
            finally:
                sampling.clear()
                await asyncio.wait(samplers, timeout=2 * HARNESS_IO_S)
            progress.at("read both stores")
            state, redis_held = await _retrying("read Redis", lambda: read_redis(redis, event_id))
            mysql_held = await _retrying("read MySQL", lambda: read_mysql(engine, event_id))
            figures = judge(
                load.answers,
                redis=redis_held,
                mysql=mysql_held,
                issued=state.issued if state else 0,
                quantity=quantity,
                per_user_limit=1,
                samples=samples,
                fault=(timeline["fault_start"], timeline["fault_end"]),
                persisted=persisted,
            )
            answers = [(a.user, a.coupon) for a in load.answers if a.status == 201 and a.coupon]
            progress.at("check the invariants")
            checks = await check_event(redis, engine, event_id, demand=shoppers, answers=answers)
        return RowResult(
            fault,
            event_id,
            figures,
            {k: round(v, 2) for k, v in timeline.items()},
            drain_s,
            [c.to_json() for c in checks],
            None,
            str(log_dir),
        )
    except Unavailable as exc:
        return RowResult(fault, event_id, None, timeline, None, [], f"SKIP: {exc}", str(log_dir))
    except Exception as exc:  # noqa: BLE001 - a row that cannot run is reported, not fatal
        return RowResult(
            fault, event_id, None, timeline, None, [], f"{type(exc).__name__}: {exc}", str(log_dir)
        )
    finally:
        progress.at("stop the services")
        if services is not None:
            await asyncio.to_thread(services.stop)
        if proxies is not None:
            await asyncio.to_thread(proxies.stop)
        if fault.kafka_brokers > 1:
            await asyncio.to_thread(stack.stop_kafka3)
        await redis.aclose()
        await engine.dispose()


def faketime_env(offset: str) -> dict[str, str]:
    """Environment that runs a process with its wall clock off by `offset` (libfaketime).

    Monotonic clocks are left alone: timeouts and backoffs stay real, only time.time() (and
    anything reading the wall clock) is skewed.
    """
    import glob

    libs = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    if not libs:
        raise Unavailable("libfaketime not installed (scripts/stack.sh install adds it)")
    return {"LD_PRELOAD": libs[0], "FAKETIME": offset, "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


async def _catalog(engine: Any, spec: EventSpec) -> None:
    """The coupon_events row every user_coupons row references (couponctl writes it too)."""
    from flashcoupon_common.db.schema import coupon_events

    async with engine.begin() as conn:
        await conn.execute(
            coupon_events.insert().values(
                id=spec.event_id,
                title=spec.title,
                quantity=spec.quantity,
                per_user_limit=spec.per_user_limit,
                start_at=spec.start_at.replace(tzinfo=None),
                end_at=spec.end_at.replace(tzinfo=None),
                valid_for_seconds=int(spec.valid_for.total_seconds()),
                spec="{}",
            )
        )


async def _drain(redis: Any, engine: Any, event_id: str, within: float) -> float | None:
    """Wait until MySQL holds as many rows as Redis issued; the monotonic time it held."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            state = await event_state.read_state(redis, event_id)
            if state is not None and await persisted_count(engine, event_id) >= state.issued:
                return time.monotonic()
        await asyncio.sleep(0.25)
    return None


def git_commit() -> str:
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return proc.stdout.strip()
