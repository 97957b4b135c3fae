"""The fault table: one `Fault` per row of `make chaos`.

Each fault has an `inject` and (unless the fault is its own end, like a process nobody
restarts) a `recover` taken `hold` seconds later, as an operator would: restart what was
killed, resume what was frozen. Durations come from `Timing`, so the test tier runs the same
rows with shorter outages. A row's `allowed` lists the failure categories its setting
documents as possible (docs/issuer.md: durability `none` may lose a crashed master's last
writes), which are then reported without failing the run.

Over 300 lines only because the table itself (one `Fault(...)` per row) is long.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flashcoupon_loadtest.chaos.runner import RowContext

Action = Callable[["RowContext"], Awaitable[None]]


@dataclass(frozen=True)
class Timing:
    """Seconds. `full` for `make chaos`, `short` for the `make test` tier."""

    rate: float  # shoppers arriving per second
    warm: float  # burst time before the fault
    after: float  # burst time after the fault ended
    freeze: float  # a frozen Kafka / MariaDB / gateway Redis
    down: float  # a killed process or server, before its restart
    redis_freeze: float  # a frozen Redis master: past cluster-node-timeout (3 s here)
    retry: float  # how long undecided shoppers keep retrying after the burst
    drain: float  # how long the pipeline may take to drain

    @classmethod
    def full(cls) -> Timing:
        return cls(
            rate=60, warm=4, after=10, freeze=30, down=5, redis_freeze=8, retry=60, drain=120
        )

    @classmethod
    def short(cls) -> Timing:
        return cls(rate=40, warm=2, after=5, freeze=5, down=2, redis_freeze=6, retry=40, drain=60)

    def burst_seconds(self, hold: float) -> float:
        """How long shoppers arrive: warm-up, the fault's hold, after it, and 5 s more."""
        return self.warm + hold + self.after + 5

    def row_budget(self, hold: float) -> float:
        """A row's deadline: its burst, retries and drain, plus 180 s for what a slow, busy box
        may take to heal the stack and start and stop the services. Past it the row is stuck."""
        return self.burst_seconds(hold) + self.retry + self.drain + 180


@dataclass(frozen=True)
class Fault:
    name: str
    what: str
    inject: Action
    recover: Action | None = None
    hold: str = "down"  # which Timing field the fault lasts: down, freeze, redis_freeze
    durability: str = "none"
    allowed: tuple[str, ...] = ()
    relays: int = 1
    persisters: int = 1
    gateway_redis: bool = False  # the gateways get a Redis Cluster of their own
    redis_proxy: bool = False  # clients reach Redis through toxiproxy (chaos/toxi.py)
    kafka_proxy: bool = False  # the relay reaches Kafka through toxiproxy
    kafka_brokers: int = 1  # 3: the row runs on a 3-broker Kafka (RF 3, min.insync 2)
    issuer_clock: str = ""  # libfaketime offset for the issuers' clock, e.g. "-30s"
    issuer_env: dict[str, str] = field(default_factory=dict)

    def hold_seconds(self, timing: Timing) -> float:
        return 0.0 if self.recover is None else float(getattr(timing, self.hold))


# ---- actions


def _kill_service(name: str) -> Action:
    async def act(ctx: RowContext) -> None:
        ctx.services.kill(name)

    return act


def _restart_service(name: str) -> Action:
    async def act(ctx: RowContext) -> None:
        await asyncio.to_thread(ctx.services.restart, name)

    return act


def _server(verb: str, which: str) -> Action:
    """verb: kill / freeze / thaw; which: kafka, mariadb, master (the event's Redis master)."""

    async def act(ctx: RowContext) -> None:
        name = {"kafka": "kafka-1", "mariadb": "mariadb", "master": ctx.master}[which]
        getattr(ctx.stack, verb)(name)

    return act


def _restart_server(part: str) -> Action:
    async def act(ctx: RowContext) -> None:
        await asyncio.to_thread(ctx.stack.start, part)

    return act


def _after_failover(then: Action) -> Action:
    """Wait until the event's old master is failed over, then `then` (restart or resume)."""

    async def act(ctx: RowContext) -> None:
        await asyncio.to_thread(ctx.stack.wait_failover, int(ctx.master.split("-")[1]))
        await then(ctx)

    return act


def _gateway_redis(verb: str) -> Action:
    async def act(ctx: RowContext) -> None:
        gw = ctx.stack.gateway_redis
        assert gw is not None
        for port in gw.redis_ports:
            getattr(gw, verb)(f"redis-{port}")

    return act


def _kafka3(verb: str, broker: str = "kafka-2") -> Action:
    """kill / start one broker of the row's 3-broker Kafka."""

    async def act(ctx: RowContext) -> None:
        k3 = ctx.stack.kafka3
        assert k3 is not None
        if verb == "kill":
            k3.kill(broker)
        else:
            await asyncio.to_thread(k3._stack, "up", "kafka")

    return act


def _proxy(verb: str, ms: int = 0, target: str = "") -> Action:
    """On a proxy (default: the event master's): latency (ms), clear, cut or mend."""

    async def act(ctx: RowContext) -> None:
        proxies = ctx.proxies
        assert proxies is not None
        name = target or ctx.master
        if verb == "latency":
            proxies.latency(name, ms)
        elif verb == "clear":
            proxies.clear(name)
        else:
            proxies.enable(name, verb == "mend")

    return act


async def _nothing(ctx: RowContext) -> None:
    """The fault is in how the services were started (issuer_clock)."""


def _faults() -> list[Fault]:
    rows = [
        Fault(
            "issuer-kill",
            "kill -9 issuer-1, restarted",
            _kill_service("issuer-1"),
            _restart_service("issuer-1"),
        ),
        Fault(
            "gateway-kill",
            "kill -9 gateway-1, restarted",
            _kill_service("gateway-1"),
            _restart_service("gateway-1"),
        ),
        Fault(
            "relay-kill",
            "kill -9 the relay, restarted",
            _kill_service("relay-1"),
            _restart_service("relay-1"),
        ),
        Fault(
            "relay-kill-survivor",
            "kill -9 relay-1 of 2, not restarted",
            _kill_service("relay-1"),
            relays=2,
        ),
        Fault(
            "persister-kill",
            "kill -9 the persister, restarted",
            _kill_service("persister-1"),
            _restart_service("persister-1"),
        ),
        Fault(
            "persister-kill-survivor",
            "kill -9 persister-1 of 2, not restarted",
            _kill_service("persister-1"),
            persisters=2,
        ),
        Fault(
            "kafka-freeze",
            "SIGSTOP the Kafka broker, SIGCONT",
            _server("freeze", "kafka"),
            _server("thaw", "kafka"),
            hold="freeze",
        ),
        Fault(
            "kafka-kill",
            "kill -9 the Kafka broker, restarted",
            _server("kill", "kafka"),
            _restart_server("kafka"),
        ),
        Fault(
            "mariadb-freeze",
            "SIGSTOP MariaDB, SIGCONT",
            _server("freeze", "mariadb"),
            _server("thaw", "mariadb"),
            hold="freeze",
        ),
        Fault(
            "mariadb-kill",
            "kill -9 MariaDB, restarted",
            _server("kill", "mariadb"),
            _restart_server("mariadb"),
        ),
        Fault(
            "gateway-redis-freeze",
            "SIGSTOP every node of the gateways' Redis, SIGCONT",
            _gateway_redis("freeze"),
            _gateway_redis("thaw"),
            hold="freeze",
            gateway_redis=True,
        ),
        Fault(
            "redis-net-latency",
            "+300 ms on every client connection to the event's Redis master (toxiproxy)",
            _proxy("latency", 300),
            _proxy("clear"),
            hold="freeze",
            redis_proxy=True,
        ),
        Fault(
            "redis-net-cut",
            "clients cut from the event's (healthy) Redis master, no failover (toxiproxy)",
            _proxy("cut"),
            _proxy("mend"),
            hold="redis_freeze",
            redis_proxy=True,
        ),
        Fault(
            "kafka3-broker-kill",
            "kill -9 one of 3 Kafka brokers (RF 3, min.insync.replicas 2), restarted",
            _kafka3("kill"),
            _kafka3("start"),
            kafka_brokers=3,
        ),
        Fault(
            "relay-kafka-cut",
            "the relay cut from Kafka (toxiproxy), mended",
            _proxy("cut", target="kafka-1"),
            _proxy("mend", target="kafka-1"),
            hold="freeze",
            kafka_proxy=True,
        ),
        Fault(
            "relay-kafka-latency",
            "+300 ms on the relay's Kafka connection (toxiproxy)",
            _proxy("latency", 300, target="kafka-1"),
            _proxy("clear", target="kafka-1"),
            hold="freeze",
            kafka_proxy=True,
        ),
        Fault(
            "issuer-clock-skew",
            "both issuers' clocks 30 s behind Redis (libfaketime), the whole row",
            _nothing,
            issuer_clock="-30s",
        ),
    ]
    for durability in ("none", "replica"):
        # `none` may lose what a crashed or demoted master had not replicated (docs/issuer.md).
        allowed = ("lost", "duplicated", "mismatch") if durability == "none" else ()
        rows += [
            Fault(
                f"redis-master-kill-{durability}",
                f"kill -9 the event's Redis master, restarted (durability {durability})",
                _server("kill", "master"),
                _after_failover(_restart_server("redis")),
                durability=durability,
                allowed=allowed,
            ),
            Fault(
                f"redis-master-freeze-{durability}",
                f"SIGSTOP the event's Redis master past cluster-node-timeout, SIGCONT: "
                f"a zombie master (durability {durability})",
                _server("freeze", "master"),
                _after_failover(_server("thaw", "master")),
                hold="redis_freeze",
                durability=durability,
                allowed=allowed,
            ),
        ]
    return rows


FAULTS: dict[str, Fault] = {f.name: f for f in _faults()}
# The `make test` tier: a few rows that cover a process crash, a survivor taking over, a
# stalled pipeline (Kafka, MariaDB) and a holder's retry after a lost answer (the gateways'
# Redis frozen: docs/reliability.md finding 1). 124 s for the five, stack start included.
SHORT_ROWS = (
    "issuer-kill",
    "relay-kill-survivor",
    "kafka-freeze",
    "mariadb-freeze",
    "gateway-redis-freeze",
)
