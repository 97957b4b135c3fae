"""The CPU of every process a drop runs on, sampled through the burst, split by phase.

On this two-core box a drop shares the cores between the services, the stack's servers (Redis,
Kafka, MariaDB), the load driver and the kernel. The phases load them differently: until the
last coupon's answer (`issuing`) every press crosses the write path — gateway, issuer, the
event's Redis master and its replica, relay, Kafka, persister, MariaDB — while after it
(`sold_out`) the gateways answer nearly every press themselves. Issue 13 asked where each
phase's CPU goes; this module samples it and does the arithmetic:

- `CpuWatch` reads, every `interval` seconds in a thread, the CPU seconds used so far by each
  service (its process tree), each stack server (its pidfile), the driver (the demo's own
  process and its children that are not services) and the whole box (/proc/stat);
- `window_cpu` takes what each used between two moments, interpolating between samples;
- `phase_cpu` applies it to the two phases and sums processes into roles (gateway-1 and
  gateway-2 are `gateway`, redis-17000..17005 are `redis`), leaving `other` for what no named
  process was charged with: the kernel's loopback work, anything else running.
"""

from __future__ import annotations

import itertools
import os
import re
import threading
import time
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from flashcoupon_loadtest.procstat import box_cpu_seconds, descendants, own_cpu_seconds

BOX = "box"  # the sample's busy CPU seconds of all cores
DRIVER = "driver"

CpuSample = tuple[float, dict[str, float]]  # (wall time, CPU seconds used so far, by name)


def stack_pids(stack_dir: Path) -> dict[str, int]:
    """The local stack's live servers (`redis-<port>`, `kafka-<id>`, `mariadb`) by pidfile:
    those this checkout started (`pids/`), and those another checkout's stack serves that
    this one reuses (`reused/`, scripts/stack.sh).

    A pidfile whose process is gone (a stopped stack, a k8s run) is skipped.
    """
    found = {}
    pidfiles = [*(stack_dir / "reused").glob("*.pid"), *(stack_dir / "pids").glob("*.pid")]
    for pidfile in sorted(pidfiles, key=lambda p: (p.stem, p.parent.name == "pids")):
        try:
            pid = int(pidfile.read_text().strip())
        except (OSError, ValueError):
            continue
        if Path(f"/proc/{pid}/stat").exists():
            found[pidfile.stem] = pid
    return found


def load_side_cpu_seconds(services: Collection[int]) -> float:
    """The load side: the demo's own process and its children that are not services'
    processes (`services`: every process of their trees; the driver's processes, counted
    after they exit too, through the demo's reaped-children times). Not the report's
    `driver_cpu_seconds`, which the driver processes measure of themselves."""
    me = os.getpid()
    skip = set(services)
    children = [p for p in descendants(me) if p != me and p not in skip]
    return own_cpu_seconds(me, reaped_children=True) + sum(own_cpu_seconds(p) for p in children)


class CpuWatch:
    """Samples the CPU of the named processes, the driver and the box in a thread."""

    def __init__(
        self,
        services: Mapping[str, int],
        stack: Mapping[str, int] | None = None,
        *,
        interval: float = 0.2,
    ) -> None:
        self.services = dict(services)
        self.stack = dict(stack or {})
        self.interval = interval
        self.samples: list[CpuSample] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def read(self) -> dict[str, float]:
        # Each service's process tree, walked once a sample for its CPU and the driver's.
        trees = {name: descendants(pid) for name, pid in self.services.items()}
        used = {name: sum(own_cpu_seconds(p) for p in tree) for name, tree in trees.items()}
        used.update({name: own_cpu_seconds(pid) for name, pid in self.stack.items()})
        used[DRIVER] = load_side_cpu_seconds([p for tree in trees.values() for p in tree])
        used[BOX] = box_cpu_seconds()[0]
        return used

    def sample(self) -> None:
        self.samples.append((time.time(), self.read()))

    def start(self) -> CpuWatch:
        """Take the first sample now, the next ones every `interval` in a thread."""

        def loop() -> None:
            while not self._stop.wait(self.interval):
                self.sample()

        self._stop.clear()
        self.sample()
        self._thread = threading.Thread(target=loop, name="cpu-watch", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[CpuSample]:
        """Stop sampling, take a last sample, and return them all."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self.sample()
        return self.samples


def cpu_at(samples: Sequence[CpuSample], name: str, t: float) -> float:
    """CPU seconds `name` had used at time `t`, linear between the samples around it (the
    first or last sample outside their span). A process that is gone reads 0.0: it is taken as
    having used nothing more."""
    points, high = [], 0.0
    for ts, used in samples:
        if name in used:
            high = max(high, used[name])  # CPU time never goes back: a gone process reads 0
            points.append((ts, high))
    if not points:
        return 0.0
    if t <= points[0][0]:
        return points[0][1]
    for (t0, c0), (t1, c1) in itertools.pairwise(points):
        if t <= t1:
            return c0 + (c1 - c0) * (t - t0) / (t1 - t0) if t1 > t0 else c1
    return points[-1][1]


def window_cpu(
    samples: Sequence[CpuSample],
    start: float,
    end: float,
    *,
    answers: int,
    names: Collection[str] | None = None,
) -> dict[str, dict[str, float]]:
    """Each process's CPU between `start` and `end`: seconds, share of one core, µs per answer
    (`names`: only these; default every sampled name)."""
    seconds = end - start
    every = dict.fromkeys(n for _, used in samples for n in used)
    out = {}
    for name in every if names is None else [n for n in every if n in names]:
        used = max(0.0, cpu_at(samples, name, end) - cpu_at(samples, name, start))
        out[name] = {
            "cpu_seconds": round(used, 2),
            "core_share": round(used / seconds, 3) if seconds > 0 else 0.0,
            "us_per_answer": round(used * 1e6 / answers, 1) if answers else 0.0,
        }
    return out


_NUMBERED = re.compile(r"^(.*)-\d+$")


def role(name: str) -> str:
    """gateway-1 → gateway, redis-17001 → redis, kafka-1 → kafka; other names as they are."""
    m = _NUMBERED.match(name)
    return m.group(1) if m else name


def by_role(processes: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """Cores per role in a window (the box excluded), largest first, plus `other`: the box's
    busy CPU that no named process was charged with (the kernel's loopback work, the rest)."""
    cores: dict[str, float] = {}
    for name, c in processes.items():
        if name != BOX:
            cores[role(name)] = cores.get(role(name), 0.0) + c["core_share"]
    out = dict(sorted(cores.items(), key=lambda kv: -kv[1]))
    if BOX in processes:
        out["other"] = max(0.0, processes[BOX]["core_share"] - sum(cores.values()))
    return {k: round(v, 3) for k, v in out.items()}


def phase_cpu(
    samples: Sequence[CpuSample],
    *,
    go: float,
    sold_out: float | None,
    end: float,
    answer_times: Sequence[float],
) -> dict[str, Any] | None:
    """The issuing phase (the go to the last coupon's answer) and the sold-out phase (from there
    to the last answer), each with its span, answers, every process's CPU and the roles'
    cores. Without a sell-out the whole burst is the issuing phase. None: not sampled."""
    if len(samples) < 2:
        return None
    bounds = {"issuing": (go, end if sold_out is None else sold_out)}
    if sold_out is not None:
        bounds["sold_out"] = (sold_out, end)
    out, counted = {}, 0
    for phase, (start, stop) in bounds.items():
        answers = sum(t <= stop for t in answer_times) - counted  # each answer in one phase
        counted += answers
        processes = window_cpu(samples, start, stop, answers=answers)
        out[phase] = {
            "seconds": round(stop - start, 3),
            "answers": answers,
            "cores": by_role(processes),
            "box_cores": processes.get(BOX, {}).get("core_share"),
            "processes": processes,
        }
    return out
