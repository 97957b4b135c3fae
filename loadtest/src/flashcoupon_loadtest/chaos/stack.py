"""A private server stack for chaos rows: its own Redis Cluster, Kafka and MariaDB.

Everything is started through scripts/stack.sh with its own FLASHCOUPON_STACK_DIR and free
ports (localrun.free_port_run: never the shared stack's that other tests use), so a row may
kill, freeze and restart any server. The gateway's own Redis Cluster (3 masters, no replicas)
is started only for the row that takes it away, a 3-broker Kafka (RF 3, min.insync.replicas 2)
only for the row that kills one of its brokers. The broker has a second listener advertised at a
proxy's port, for the relay ↔ Kafka rows (chaos/toxi.py).

The one subtle part: every server's pid is read from the pidfile stack.sh wrote, so a fault
signals exactly the process this stack started, and a restart is `stack.sh up <part>`, which
starts only what is not alive and waits for readiness (cluster_state ok and replicas linked,
a Kafka round trip, a MariaDB login).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from flashcoupon_loadtest.localrun import free_port_run

ROOT = Path(__file__).resolve().parents[4]
STACK = ROOT / "scripts" / "stack.sh"


@dataclass
class PrivateStack:
    """One private stack: `start()`, then signal its servers by part name."""

    state: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="fc-chaos-")))
    redis_nodes: int = 6
    env: dict[str, str] = field(default_factory=dict)
    gateway_redis: PrivateStack | None = None
    kafka3: PrivateStack | None = None

    def __post_init__(self) -> None:
        if not self.env:
            redis_base = free_port_run(self.redis_nodes, offset=10000)
            kafka = free_port_run(1, offset=100)
            self.env = {
                "FLASHCOUPON_STACK_DIR": str(self.state),
                "REDIS_BASE_PORT": str(redis_base),
                "REDIS_NODES": str(self.redis_nodes),
                "REDIS_REPLICAS": "1",
                "KAFKA_BASE_PORT": str(kafka),
                "KAFKA_CONTROLLER_BASE_PORT": str(kafka + 100),
                "KAFKA_HEAP": "384m",
                "KAFKA_PROXIED_BASE_PORT": str(free_port_run(1)),
                "KAFKA_PROXIED_ADVERTISED_BASE_PORT": str(free_port_run(1)),
                "MYSQL_PORT": str(free_port_run(1)),
            }

    # ---- addresses

    @property
    def redis_ports(self) -> list[int]:
        base = int(self.env["REDIS_BASE_PORT"])
        return list(range(base, base + int(self.env["REDIS_NODES"])))

    @property
    def redis_nodes_setting(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.redis_ports)

    @property
    def kafka_bootstrap(self) -> str:
        base, brokers = int(self.env["KAFKA_BASE_PORT"]), int(self.env.get("KAFKA_BROKERS", "1"))
        return ",".join(f"127.0.0.1:{base + i}" for i in range(brokers))

    @property
    def mysql_url(self) -> str:
        port = self.env["MYSQL_PORT"]
        return f"mysql+asyncmy://flashcoupon:flashcoupon@127.0.0.1:{port}/flashcoupon"

    def service_env(self) -> dict[str, str]:
        """What the services and the checker need to reach this stack (and nothing else)."""
        return {
            "FLASHCOUPON_REDIS_NODES": self.redis_nodes_setting,
            "FLASHCOUPON_KAFKA_BOOTSTRAP": self.kafka_bootstrap,
            "FLASHCOUPON_MYSQL_URL": self.mysql_url,
        }

    # ---- lifecycle

    def _stack(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, **self.env}
        # The Kafka jars are fetched once per checkout; a worktree may reuse the main one's.
        env.setdefault("FLASHCOUPON_CACHE_DIR", str(ROOT / ".cache"))
        # stack.sh waits at most a minute for each server; `up` may restart several.
        timeout = 600 if args[0] == "up" else 120
        try:
            proc = subprocess.run(
                [str(STACK), *args],
                env=env,
                capture_output=True,
                text=True,
                check=False,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as exc:
            out = (exc.stdout or b"").decode(errors="replace")  # printed before the deadline
            proc = subprocess.CompletedProcess(
                exc.cmd, 124, f"{out}\nstack.sh {' '.join(args)}: no end within {timeout} s\n", ""
            )
        if check and proc.returncode != 0:
            raise RuntimeError(f"stack.sh {' '.join(args)} failed:\n{proc.stdout}{proc.stderr}")
        return proc

    def start(self, *parts: str) -> None:
        # stack.sh gives a server 60 s to open its port; on a machine shared with other
        # engineers' runs a JVM can take longer. `up` is idempotent: asking again waits again.
        for attempt in range(3):
            try:
                self._stack("up", *parts)
                break
            except RuntimeError:
                if attempt == 2:
                    raise
        if not parts or "mariadb" in parts:
            self.migrate()

    def migrate(self) -> None:
        migrate = Path(sys.executable).parent / "flashcoupon-migrate"
        subprocess.run(
            [str(migrate), "upgrade"],
            env={**os.environ, **self.service_env()},
            check=True,
            capture_output=True,
        )

    def start_gateway_redis(self) -> PrivateStack:
        """A second, replica-less Redis Cluster for the gateway (rate limits, waiting room)."""
        if self.gateway_redis is None:
            base = free_port_run(3, offset=10000)
            state = self.state / "gateway-redis"
            env = {
                "FLASHCOUPON_STACK_DIR": str(state),
                "REDIS_BASE_PORT": str(base),
                "REDIS_NODES": "3",
                "REDIS_REPLICAS": "0",
            }
            self.gateway_redis = PrivateStack(state=state, redis_nodes=3, env=env)
            self.gateway_redis._stack("up", "redis")
        return self.gateway_redis

    def start_kafka3(self) -> PrivateStack:
        """A second Kafka of 3 brokers (RF 3, min.insync.replicas 2 by stack.sh's rule)."""
        if self.kafka3 is None:
            base = free_port_run(3, offset=100)
            state = self.state / "kafka3"
            env = {
                "FLASHCOUPON_STACK_DIR": str(state),
                "KAFKA_BROKERS": "3",
                "KAFKA_BASE_PORT": str(base),
                "KAFKA_CONTROLLER_BASE_PORT": str(base + 100),
                "KAFKA_HEAP": "384m",
            }
            self.kafka3 = PrivateStack(state=state, env=env)
        self.kafka3._stack("up", "kafka")
        return self.kafka3

    def stop_kafka3(self) -> None:
        if self.kafka3 is not None:
            self.kafka3._stack("down", "kafka", check=False)
            self.kafka3 = None

    def healthy(self) -> tuple[bool, str]:
        proc = self._stack("status", check=False)
        return proc.returncode == 0, proc.stdout

    def stop(self, *, wipe: bool = True) -> None:
        if self.gateway_redis is not None:
            self.gateway_redis._stack("down", "redis", check=False)
        self.stop_kafka3()
        self._stack("down", check=False)
        if wipe:
            shutil.rmtree(self.state, ignore_errors=True)

    # ---- signals to one server

    def pidfile(self, name: str) -> Path:
        """name: `kafka-1`, `mariadb` or `redis-<port>`."""
        return Path(self.env["FLASHCOUPON_STACK_DIR"]) / "pids" / f"{name}.pid"

    def pid(self, name: str) -> int:
        return int(self.pidfile(name).read_text().strip())

    def kill(self, name: str) -> None:
        """SIGKILL, as a crash: no clean shutdown; the pidfile goes so `up` restarts it."""
        pid = self.pid(name)
        os.kill(pid, signal.SIGKILL)
        _reap(pid)
        self.pidfile(name).unlink(missing_ok=True)

    def wait_failover(self, port: int, within: float = 60.0) -> float:
        """Wait until the cluster marked node `port` failed and is whole again without it.

        Restarting a master of this disposable stack (no RDB/AOF) before its replica took
        over would bring it back empty *as master*, and its replica would then copy the empty
        dataset: the whole shard lost. An operator (or an orchestrator with a startup delay
        longer than cluster-node-timeout) waits for the failover first. Returns the seconds
        waited.
        """
        import time

        began = time.monotonic()
        others = [p for p in self.redis_ports if p != port]
        while time.monotonic() - began < within:
            for other in others:
                nodes = _cli(other, "cluster", "nodes")
                info = _cli(other, "cluster", "info")
                dead = [ln for ln in nodes.splitlines() if f"127.0.0.1:{port}@" in ln]
                failed = bool(dead) and "fail" in dead[0].split()[2].split(",")
                if failed and "cluster_state:ok" in info:
                    return time.monotonic() - began
            time.sleep(0.2)
        raise TimeoutError(f"redis :{port} was not failed over within {within:.0f}s")

    def freeze(self, name: str) -> None:
        os.kill(self.pid(name), signal.SIGSTOP)

    def thaw(self, name: str) -> None:
        os.kill(self.pid(name), signal.SIGCONT)


def _cli(port: int, *args: str) -> str:
    proc = subprocess.run(
        ["redis-cli", "-p", str(port), *args], capture_output=True, text=True, timeout=5
    )
    return proc.stdout.replace("\r", "")


def _reap(pid: int) -> None:
    """Wait until a killed server's pid is gone (its ports free) before anyone restarts it."""
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
