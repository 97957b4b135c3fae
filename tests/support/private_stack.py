"""Private server instances for failure-injection tests.

A test that stops or kills a server must not touch the shared stack other tests use, so it
starts its own instance through scripts/stack.sh with its own state dir and ports, and can
stop/start it at will, on ports of its own (localrun.free_port_run).
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.paths import ROOT
from tests.support.ports import free_port_run

STACK = ROOT / "scripts" / "stack.sh"


@dataclass
class PrivateServer:
    """One server part (kafka or mariadb) of a private stack."""

    part: str
    env: dict[str, str] = field(default_factory=dict)

    def _run(self, *args: str) -> None:
        subprocess.run([str(STACK), *args], check=True, env={**os.environ, **self.env})

    def start(self) -> None:
        self._run("up", self.part)

    def stop(self) -> None:
        self._run("down", self.part)

    def status(self) -> subprocess.CompletedProcess[str]:
        """`scripts/stack.sh status` for this private stack (exit code 1 = unhealthy)."""
        return subprocess.run(
            [str(STACK), "status"], env={**os.environ, **self.env}, capture_output=True, text=True
        )

    def _pidfile(self, port: int | None) -> Path:
        pids = Path(self.env["FLASHCOUPON_STACK_DIR"]) / "pids"
        name = {"kafka": "kafka-1", "redis": f"redis-{port}"}.get(self.part, self.part)
        return pids / f"{name}.pid"

    def kill(self, port: int | None = None) -> None:
        """SIGKILL, as a crash would: no clean shutdown. For redis, the node on `port`."""
        pidfile = self._pidfile(port)
        os.kill(int(pidfile.read_text()), signal.SIGKILL)
        pidfile.unlink()

    def freeze(self, port: int | None = None) -> None:
        """SIGSTOP: a hung server. Its kernel still accepts connections; nothing answers."""
        os.kill(int(self._pidfile(port).read_text()), signal.SIGSTOP)

    def thaw(self, port: int | None = None) -> None:
        """SIGCONT after freeze(): the server carries on with whatever reached its sockets."""
        os.kill(int(self._pidfile(port).read_text()), signal.SIGCONT)


def private_kafka() -> tuple[PrivateServer, str]:
    """A stopped private Kafka broker and its bootstrap address; call .start()."""
    port = free_port_run(1, offset=100)
    state = tempfile.mkdtemp(prefix="fc-kafka-")
    env = {
        "FLASHCOUPON_STACK_DIR": state,
        "KAFKA_BASE_PORT": str(port),
        "KAFKA_CONTROLLER_BASE_PORT": str(port + 100),
        "KAFKA_HEAP": "384m",
    }
    return PrivateServer("kafka", env), f"127.0.0.1:{port}"


def private_mariadb() -> tuple[PrivateServer, str]:
    """A stopped private MariaDB and its SQLAlchemy URL (database `flashcoupon`); call .start()."""
    port = free_port_run(1)
    state = tempfile.mkdtemp(prefix="fc-mariadb-")
    env = {"FLASHCOUPON_STACK_DIR": state, "MYSQL_PORT": str(port)}
    return PrivateServer(
        "mariadb", env
    ), f"mysql+asyncmy://flashcoupon:flashcoupon@127.0.0.1:{port}/flashcoupon"


def private_redis(nodes: int = 6, replicas: int = 1) -> tuple[PrivateServer, list[int]]:
    """A stopped private Redis Cluster and its node ports; call .start().

    Cluster nodes also listen on port+10000 (the cluster bus): localrun.free_port_run picks
    both below the kernel's ephemeral range, so no outgoing connection can take a node's port
    between this pick and its bind.
    """
    base = free_port_run(nodes, offset=10000)
    ports = list(range(base, base + nodes))
    state = tempfile.mkdtemp(prefix="fc-redis-")
    env = {
        "FLASHCOUPON_STACK_DIR": state,
        "REDIS_BASE_PORT": str(base),
        "REDIS_NODES": str(nodes),
        "REDIS_REPLICAS": str(replicas),
    }
    return PrivateServer("redis", env), ports
