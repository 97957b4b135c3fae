"""Run the flashcoupon services as local processes: two gateways, two issuers, a relay, a
persister and a wallet, pointed at the local stack.

    uv run python -m flashcoupon_loadtest.localrun        # until Ctrl-C; prints the URLs

Each service gets a free port (or base_port + n), the stack's FLASHCOUPON_* variables plus
its own, and a log file .stack/logs/svc-<name>.log. `start()` waits for every /readyz and
stops everything it started if one fails to come up; `stop()` (also on Ctrl-C or an
exception through the context manager) sends SIGTERM, then SIGKILL after a grace period, to
exactly the processes it started. The gateways round-robin over both issuers themselves
(FLASHCOUPON_GATEWAY_ISSUER_URLS), so no local load balancer is needed in front of issuers;
the load driver spreads its connections over both gateways.

Over 300 lines on purpose: half of it is `LocalServices`, whose start, readiness wait and
stop must see one list of the processes it started (so it never stops anything else).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from flashcoupon_common.settings import KafkaSettings, MysqlSettings, RedisSettings

from flashcoupon_loadtest.tokens import DEMO_SECRET

ROOT = Path(__file__).resolve().parents[3]
LOG_DIR = ROOT / ".stack" / "logs"


def git(*args: str) -> str:
    """`git <args>`'s output in this repository; CalledProcessError (with git's stderr) when it
    fails."""
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True
    ).stdout


# Where free_port looks first: below the kernel's ephemeral range (32768-60999 by default) and
# clear of the stacks' fixed ports (Redis 17000-18005 and their cluster bus +10000, Kafka
# 18092-19192, MariaDB 13306 and 23306) and of Kubernetes' NodePorts (30000-32767).
SERVER_PORTS = range(24000, 27000)
# Where private stacks go (the tests' private Redis, Kafka and MariaDB, chaos rows and their
# proxies: free_port_run). With a Redis cluster bus at +10000 (29200-29899) or a Kafka
# controller at +100, clear of every fixed port the scripts use (the stacks' above, Kubernetes'
# 11xxx-16xxx, Jaeger's 14xxx and 16xxx, the stack Redis buses 27000-28005), of SERVER_PORTS,
# of NodePorts and of the ephemeral range; above 16383, so a port never reads as a Redis slot
# number in CLUSTER SLOTS (chaos/toxi.py looks for the ports there).
PRIVATE_PORTS = range(19200, 19900)


def port_is_free(port: int) -> bool:
    """Whether a server could bind 127.0.0.1:`port` now."""
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port_run(count: int, *, offset: int = 0) -> int:
    """A base port b of PRIVATE_PORTS with b..b+count-1 free now, and b+offset.. too when an
    offset is given (a Redis node's cluster bus, a Kafka broker's controller port). Walked in
    turn as free_port's: a private stack picks all its ports before it starts any server."""
    base = _free_run(PRIVATE_PORTS, count, offset)
    if base is None:
        raise RuntimeError(f"no free run of {count} ports in {PRIVATE_PORTS}")
    return base


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now, for a server about to bind it.

    Not one the kernel picks (bind to port 0): that comes from the ephemeral range, which the
    kernel also hands to every outgoing connection as its local port, so between this call and
    the server's bind a client (the driver, a service's connection to Redis or Kafka) could get
    it, and the server would fail with "address already in use" — `make demo --concurrency
    512` once did at start-up. A port of `SERVER_PORTS` can only be taken by another server.
    The kernel's pick is the fallback when the range is full or overlaps the ephemeral one.

    Each call goes on from where the last one stopped (from a random place in the first), so a
    process is not handed the same port twice before its servers bind them, as the services of
    one run are picked all at once.
    """
    if SERVER_PORTS.stop <= _ephemeral_start():
        port = _free_run(SERVER_PORTS, 1, 0)
        if port is not None:
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# Where each range's walk goes on from (free_port, free_port_run), from a random place at first.
_cursors: dict[range, int] = {}
_cursor_lock = threading.Lock()


def _free_run(ports: range, count: int, offset: int) -> int | None:
    """The next base of `ports`, in turn, whose run of `count` ports (and the same +offset)
    is free now; the walk then goes on past the run, so no port is handed out twice until the
    whole range has been walked. None: no such run."""
    bases = range(ports.start, ports.stop - count + 1)
    if not bases:
        return None
    with _cursor_lock:
        start = _cursors.get(ports, random.randrange(len(bases)))  # an index into `bases`
        for step in range(len(bases)):
            i = (start + step) % len(bases)
            base = bases[i]
            if all(
                port_is_free(p) and (not offset or port_is_free(p + offset))
                for p in range(base, base + count)
            ):
                _cursors[ports] = (i + count) % len(bases)
                return base
    return None


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def wait_ready(
    url: str,
    *,
    timeout: float = 60.0,
    proc: subprocess.Popen[bytes] | None = None,
    abort: threading.Event | None = None,
    times: int = 1,
) -> None:
    """Poll `url` until it answers 200 `times` times in a row, each on a new connection; fail
    early if `proc` exits or `abort` is set. `times` > 1 is for a URL behind a balancer (a
    NodePort picks an endpoint per connection): every way through it must answer."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    streak = 0
    while time.monotonic() < deadline:
        if abort is not None and abort.is_set():
            raise RuntimeError(f"{url}: aborted while waiting for readiness")
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{url}: the process exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    streak += 1
                    if streak >= times:
                        return
                    continue
                last = f"HTTP {r.status}"
        except urllib.error.HTTPError as e:
            last = f"HTTP {e.code}: {e.read()[:300]!r}"
        except OSError as e:
            last = str(e)
        streak = 0
        time.sleep(0.2)
    raise TimeoutError(f"{url} not ready after {timeout:.0f}s ({last})")


def batch_scheduling() -> bool:
    """Put this process, and every process it starts from now on, under SCHED_BATCH.

    On one shared 2-core machine the drop's ~15 processes (driver, gateways, issuers, Redis,
    relay, Kafka, persister) hand requests to each other all the time. Under SCHED_OTHER each
    handoff wakes the receiver, which preempts the sender mid-turn: a gateway writing a Redis
    batch or an answer stalls until Redis or the driver yields, over and over. SCHED_BATCH
    (no privilege needed) turns that wakeup preemption off, so each process finishes its loop
    turn first; the local stack starts Redis the same way (scripts/stack.sh). 60,000-coupon
    demos, five pairs taken alternately: sold out in 19.1 s instead of 22.2 (medians), every
    pair faster. False where the platform has no SCHED_BATCH (the demo then runs as before).
    """
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except (AttributeError, OSError):
        return False
    return True


def add_scheduling_option(parser: argparse.ArgumentParser) -> None:
    """`--scheduling batch|default`, the same option for the demo and the benchmarks."""
    parser.add_argument(
        "--scheduling",
        choices=("batch", "default"),
        default="batch",
        help="batch (the default): SCHED_BATCH for this process and all it starts, as the "
        "local stack's Redis (localrun.batch_scheduling); default: the OS's own policy",
    )


def apply_scheduling(choice: str) -> None:
    if choice == "batch":
        batch_scheduling()


def stack_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The FLASHCOUPON_* variables pointing services at the stack (as `scripts/stack.sh env`)."""
    redis = RedisSettings.from_env(env)
    return {
        "FLASHCOUPON_REDIS_NODES": ",".join(f"{h}:{p}" for h, p in redis.nodes),
        "FLASHCOUPON_KAFKA_BOOTSTRAP": KafkaSettings.from_env(env).bootstrap,
        "FLASHCOUPON_MYSQL_URL": MysqlSettings.from_env(env).url,
    }


@dataclass
class Service:
    name: str  # e.g. gateway-1
    command: str  # console script from the workspace
    prefix: str  # env prefix, e.g. FLASHCOUPON_GATEWAY
    port: int
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _script(name: str) -> list[str]:
    """The workspace's console script (same venv as this interpreter)."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        raise FileNotFoundError(f"{path} missing: run `uv sync` (is the service installed?)")
    return [str(path)]


class LocalServices:
    """The suite as processes. Use as a context manager, or call start()/stop()."""

    def __init__(
        self,
        *,
        gateways: int = 2,
        issuers: int = 2,
        relays: int = 1,
        persisters: int = 1,
        wallet: bool = True,
        jwt_secret: str = DEMO_SECRET,
        env: Mapping[str, str] | None = None,
        per_service_env: Mapping[str, Mapping[str, str]] | None = None,
        base_port: int | None = None,
        log_dir: Path = LOG_DIR,
        ready_timeout: float = 90.0,
    ) -> None:
        given = {**os.environ, **(env or {})}
        self.base_env = {**given, **stack_env(given)}
        # start() may run in a thread while stop() is called from another (Ctrl-C):
        # the lock keeps a process from being started after stop() signalled the rest.
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.log_dir = log_dir
        self.ready_timeout = ready_timeout
        extra = per_service_env or {}
        ports = iter(range(base_port, base_port + 100)) if base_port else None

        def svc(name: str, command: str, prefix: str, kind: str, **env: str) -> Service:
            port = next(ports) if ports else free_port()
            return Service(name, command, prefix, port, {**env, **extra.get(kind, {})})

        self.issuers = [
            svc(f"issuer-{i + 1}", "flashcoupon-issuer", "FLASHCOUPON_ISSUER", "issuer")
            for i in range(issuers)
        ]
        self.wallets = (
            [svc("wallet", "flashcoupon-wallet", "FLASHCOUPON_WALLET", "wallet")] if wallet else []
        )
        self.relays = [
            svc(f"relay-{i + 1}", "flashcoupon-relay", "FLASHCOUPON_RELAY", "relay")
            for i in range(relays)
        ]
        self.persisters = [
            svc(f"persister-{i + 1}", "flashcoupon-persister", "FLASHCOUPON_PERSISTER", "persister")
            for i in range(persisters)
        ]
        upstream = {
            "FLASHCOUPON_GATEWAY_ISSUER_URLS": ",".join(s.url for s in self.issuers),
            "FLASHCOUPON_GATEWAY_JWT_SECRET": jwt_secret,
            # The load driver plays the ingress: it sends each shopper's address in
            # X-Forwarded-For, so per-IP limits apply per shopper, not to 127.0.0.1.
            "FLASHCOUPON_GATEWAY_TRUSTED_PROXIES": "1",
        }
        if self.wallets:
            upstream["FLASHCOUPON_GATEWAY_WALLET_URL"] = self.wallets[0].url
        self.gateways = [
            svc(
                f"gateway-{i + 1}",
                "flashcoupon-gateway",
                "FLASHCOUPON_GATEWAY",
                "gateway",
                **upstream,
            )
            for i in range(gateways)
        ]

    @property
    def services(self) -> list[Service]:
        # Upstreams first, so a gateway's readiness check finds its issuers up.
        return [*self.issuers, *self.wallets, *self.relays, *self.persisters, *self.gateways]

    @property
    def gateway_urls(self) -> list[str]:
        return [s.url for s in self.gateways]

    @property
    def issuer_urls(self) -> list[str]:
        return [s.url for s in self.issuers]

    @property
    def wallet_url(self) -> str | None:
        return self.wallets[0].url if self.wallets else None

    def start(self) -> LocalServices:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._stopping.clear()
        try:
            for s in self.services:
                with self._lock:
                    if self._stopping.is_set():
                        raise RuntimeError("stopped while starting")
                    self._spawn(s)
            for s in self.services:
                try:
                    wait_ready(
                        f"{s.url}/readyz",
                        timeout=self.ready_timeout,
                        proc=s.proc,
                        abort=self._stopping,
                    )
                except (RuntimeError, TimeoutError) as exc:
                    raise RuntimeError(f"{s.name} did not become ready: {exc}\n{self.tail(s)}")
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, s: Service) -> None:
        env = {
            **self.base_env,
            f"{s.prefix}_HOST": "127.0.0.1",
            f"{s.prefix}_PORT": str(s.port),
            **s.env,
        }
        s.log = open(self.log_dir / f"svc-{s.name}.log", "ab")  # noqa: SIM115
        cmd = [*_script(s.command), "--host", "127.0.0.1", "--port", str(s.port)]
        s.proc = subprocess.Popen(
            cmd, env=env, stdout=s.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )

    def tail(self, s: Service, lines: int = 30) -> str:
        path = self.log_dir / f"svc-{s.name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        body = "\n".join(text.splitlines()[-lines:])
        return f"--- last lines of {path} ---\n{body}"

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM every process we started (gateways first), SIGKILL what outlives `grace`."""
        with self._lock:
            self._stopping.set()
        running = [s for s in reversed(self.services) if s.proc and s.proc.poll() is None]
        for s in running:
            assert s.proc is not None
            s.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for s in running:
            assert s.proc is not None
            try:
                s.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                s.proc.kill()
                s.proc.wait(timeout=5)
        for s in self.services:
            if s.log is not None:
                s.log.close()
                s.log = None

    def __enter__(self) -> LocalServices:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> int:
    with LocalServices() as svc:
        for s in svc.services:
            print(f"{s.name:<12} {s.url}  (log .stack/logs/svc-{s.name}.log)")
        print("running; Ctrl-C stops them all")
        try:
            while all(s.proc and s.proc.poll() is None for s in svc.services):
                time.sleep(1)
            print("a service exited; stopping the rest")
            return 1
        except KeyboardInterrupt:
            return 0


if __name__ == "__main__":
    sys.exit(main())
