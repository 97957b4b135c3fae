"""Network faults between the services and Redis or Kafka, through toxiproxy (no tc/netem).

Redis Cluster tells its clients where each node is (CLUSTER SLOTS, MOVED), so a proxy in
front of a node's port alone would be bypassed after the first redirect. Instead every node
of the private cluster is given a proxy and told to *announce* the proxy's port
(`CONFIG SET cluster-announce-port`), while its cluster bus keeps its real port
(`cluster-announce-bus-port`): client traffic — issuers, relay, gateways, and the checker's
own reads — goes through the proxies, node-to-node gossip and replication do not, so a cut
isolates the clients from a healthy master and no failover happens. Services are started
after the announce change (per row), so they learn the proxied addresses from the first
CLUSTER SLOTS. The announce ports are reset when the row ends.

Kafka likewise tells clients where its brokers are (metadata): the private stack's broker has a
second listener, PROXIED, that advertises the proxy's port (scripts/stack.sh,
KAFKA_PROXIED_*), and only the relay is given the proxy as its bootstrap: so a cut or latency
hits relay ↔ Kafka and nothing else (the persister and the checker use the plain listener).

toxiproxy-server is built from the Go module proxy into .cache/bin when missing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from flashcoupon_loadtest.chaos.stack import ROOT, PrivateStack, _cli
from flashcoupon_loadtest.localrun import free_port, free_port_run

BIN = ROOT / ".cache" / "bin" / "toxiproxy-server"
MODULE = "github.com/Shopify/toxiproxy/v2/cmd/server@v2.5.0"


class Unavailable(RuntimeError):
    """toxiproxy cannot be built here (no Go toolchain or no module proxy)."""


def ensure_binary() -> Path:
    if BIN.exists():
        return BIN
    go = shutil.which("go") or (
        "/usr/local/go/bin/go" if Path("/usr/local/go/bin/go").exists() else None
    )
    if go is None:
        raise Unavailable("toxiproxy-server missing and no Go toolchain to build it")
    gobin = BIN.parent / "toxiproxy-build"
    proc = subprocess.run(
        ["nice", "-n", "19", go, "install", MODULE],
        env={**os.environ, "GOBIN": str(gobin)},
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise Unavailable(f"go install {MODULE} failed: {proc.stderr[-500:]}")
    (gobin / "server").rename(BIN)
    return BIN


class Toxiproxy:
    """A toxiproxy server and its proxies (`routes`: name → (listen port, upstream port))."""

    def __init__(self, routes: dict[str, tuple[int, int]], log_dir: Path) -> None:
        self.routes = routes
        self.api_port = free_port()
        log_dir.mkdir(parents=True, exist_ok=True)
        self._log = open(log_dir / "toxiproxy.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                "nice",
                "-n",
                "5",
                str(ensure_binary()),
                "-host",
                "127.0.0.1",
                "-port",
                str(self.api_port),
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    def _api(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.api_port}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=5) as r:
            raw = r.read()
        try:
            return json.loads(raw) if raw else None
        except json.JSONDecodeError:  # GET /version answers plain text
            return raw.decode()

    def start(self) -> None:
        deadline = time.monotonic() + 15
        while True:
            try:
                self._api("GET", "/version")
                break
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("toxiproxy-server did not start") from None
                time.sleep(0.2)
        for name, (listen, upstream) in self.routes.items():
            self._api(
                "POST",
                "/proxies",
                {
                    "name": name,
                    "listen": f"127.0.0.1:{listen}",
                    "upstream": f"127.0.0.1:{upstream}",
                    "enabled": True,
                },
            )

    def latency(self, node: str, ms: int) -> None:
        self._api(
            "POST",
            f"/proxies/{node}/toxics",
            {
                "name": "lat",
                "type": "latency",
                "stream": "downstream",
                "attributes": {"latency": ms, "jitter": ms // 10},
            },
        )

    def clear(self, node: str) -> None:
        for toxic in self._api("GET", f"/proxies/{node}/toxics") or []:
            self._api("DELETE", f"/proxies/{node}/toxics/{toxic['name']}")

    def enable(self, node: str, enabled: bool) -> None:
        """Disabled: open connections are closed and new ones refused."""
        self._api("POST", f"/proxies/{node}", {"enabled": enabled})

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._log.close()


class KafkaProxy(Toxiproxy):
    """One proxy, `kafka-1`, in front of the private broker's PROXIED listener."""

    def __init__(self, stack: PrivateStack, log_dir: Path) -> None:
        listen = int(stack.env["KAFKA_PROXIED_ADVERTISED_BASE_PORT"])
        super().__init__({"kafka-1": (listen, int(stack.env["KAFKA_PROXIED_BASE_PORT"]))}, log_dir)
        self.bootstrap = f"127.0.0.1:{listen}"


class RedisProxies(Toxiproxy):
    """One proxy per node of `stack`'s Redis Cluster, announced by the nodes themselves."""

    def __init__(self, stack: PrivateStack, log_dir: Path) -> None:
        self.stack = stack
        self.base = free_port_run(len(stack.redis_ports))
        self.proxy_of = {p: self.base + i for i, p in enumerate(stack.redis_ports)}
        routes = {f"redis-{p}": (proxy, p) for p, proxy in self.proxy_of.items()}
        super().__init__(routes, log_dir)

    def start(self) -> None:
        super().start()
        for port, proxy in self.proxy_of.items():
            _cli(port, "config", "set", "cluster-announce-bus-port", str(port + 10000))
            _cli(port, "config", "set", "cluster-announce-port", str(proxy))
        self._wait_announced(set(self.proxy_of.values()))

    def _wait_announced(self, want: set[int], within: float = 20.0) -> None:
        """Until every node's CLUSTER SLOTS lists exactly the ports `want` (gossip is lazy)."""
        known = set(self.proxy_of) | set(self.proxy_of.values())
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            ok = True
            for port in self.stack.redis_ports:
                slots = _cli(port, "cluster", "slots").split()
                ok = ok and {int(x) for x in slots if x.isdigit() and int(x) in known} == want
            if ok:
                return
            time.sleep(0.3)
        raise RuntimeError(f"Redis nodes did not announce ports {sorted(want)}")

    def stop(self) -> None:
        try:
            for port in self.proxy_of:
                _cli(port, "config", "set", "cluster-announce-port", "0")
                _cli(port, "config", "set", "cluster-announce-bus-port", "0")
            # Until every node lists the real ports again, a new client could be sent to a
            # proxy that no longer exists.
            self._wait_announced(set(self.proxy_of))
        finally:
            super().stop()
