"""The load driver: runs a scenario in worker processes and gathers their per-request records.

Each worker process runs its own uvloop event loop and its share of the scenario (shard i of
n). Workers first prepare (mint tokens, open keep-alive connections), report ready, and then
wait for one shared "go" — so a burst starts in every process at the same instant (e.g. an
event's startAt) and connection set-up is never measured. Progress (answers, coupons issued)
is shared through a small array the parent polls.

    python -m flashcoupon_loadtest.driver --selftest   # the driver's own ceiling, see selftest.py
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing.sharedctypes import SynchronizedArray
from typing import Any, Protocol

from flashcoupon_common import heap

from flashcoupon_loadtest.http1 import Target
from flashcoupon_loadtest.procstat import BoxCpu, box_cpu_seconds
from flashcoupon_loadtest.stats import Record

Progress = Callable[[int, int, float], None]  # (answers, issued, seconds since go)


@dataclass
class WorkerContext:
    index: int
    count: int
    targets: tuple[Target, ...]
    _progress: Any = field(default=None, repr=False)

    def target_for(self, slot: int) -> Target:
        """Spread connections over the targets (e.g. two gateways) round-robin."""
        return self.targets[(self.index + slot * self.count) % len(self.targets)]

    def tick(self, answers: int = 1, issued: int = 0) -> None:
        if self._progress is not None:
            self._progress[2 * self.index] += answers
            self._progress[2 * self.index + 1] += issued


class Scenario(Protocol):
    name: str

    async def prepare(self, ctx: WorkerContext) -> None: ...

    async def fire(self, ctx: WorkerContext) -> list[Record]: ...


class RunAborted(Exception):
    """The run was stopped from outside (`stop` was set); the workers are terminated."""


@dataclass
class RunResult:
    scenario: str
    records: list[Record]
    processes: int
    wall_seconds: float  # from go to the last worker finishing
    cpu_seconds: float  # the workers' own CPU time while firing (the driver's cost)
    go_at: float  # wall clock of the go signal
    # The box's (busy, total) CPU seconds from the first worker's first press to the last
    # worker's last answer: preparing and gathering records left out.
    box_cpu_seconds: BoxCpu | None = None

    @property
    def driver_ceiling_rps(self) -> float:
        """Requests per CPU-second the driver spent: what it could drive per busy core."""
        return len(self.records) / self.cpu_seconds if self.cpu_seconds > 0 else 0.0


def _worker(
    scenario: Scenario,
    ctx: WorkerContext,
    progress: SynchronizedArray[int],
    ready: Any,
    go: Any,
    results: Any,
) -> None:
    import asyncio

    try:
        import uvloop

        uvloop.install()
    except ImportError:  # uvloop is a speed-up, not a requirement
        pass
    ctx._progress = progress

    async def main() -> None:
        await scenario.prepare(ctx)
        # The prepared shoppers (tokens, request bytes) and the records to come live until the
        # end: no full collection walks them, whose pauses would show up as server latency.
        heap.settle_after_startup()
        heap.hold_full_collections()
        ready.put(ctx.index)
        await asyncio.to_thread(go.wait)
        box0 = box_cpu_seconds()
        cpu0 = time.process_time()
        records = await scenario.fire(ctx)
        cpu = time.process_time() - cpu0
        results.put((ctx.index, records, cpu, (box0, box_cpu_seconds())))

    try:
        asyncio.run(main())
    except BaseException as exc:
        results.put((ctx.index, exc, 0.0, None))
        raise


def run(
    scenario: Scenario,
    targets: Sequence[str],
    *,
    processes: int = 1,
    start_at: float | None = None,
    progress: Progress | None = None,
    progress_interval: float = 1.0,
    timeout: float = 600.0,
    stop: threading.Event | None = None,
) -> RunResult:
    """Run `scenario` in `processes` workers; fire at wall time `start_at` (or when ready).

    Setting `stop` (e.g. from an event loop whose task was cancelled by Ctrl-C, while this
    runs in a thread) terminates the workers and raises RunAborted within ~0.2 s.
    """
    stop = stop or threading.Event()
    spawn = mp.get_context("spawn")  # the caller may hold threads or an event loop: no fork
    parsed = tuple(Target.parse(t) for t in targets)
    counters = spawn.Array("q", 2 * processes, lock=False)
    ready, results, go = spawn.Queue(), spawn.Queue(), spawn.Event()
    workers = [
        spawn.Process(
            target=_worker,
            args=(scenario, WorkerContext(i, processes, parsed), counters, ready, go, results),
            name=f"loadtest-{scenario.name}-{i}",
            daemon=True,
        )
        for i in range(processes)
    ]
    for w in workers:
        w.start()
    try:
        deadline = time.monotonic() + timeout
        for _ in workers:
            _get_or_fail(ready, workers, deadline, results, stop)
        if start_at is not None and stop.wait(max(0.0, start_at - time.time())):
            raise RunAborted(scenario.name)
        go_at = time.time()
        go.set()
        collected: dict[int, tuple[list[Record], float]] = {}
        windows: list[tuple[BoxCpu, BoxCpu]] = []
        next_report = time.monotonic() + progress_interval
        while len(collected) < processes:
            try:
                index, records, cpu, window = results.get(timeout=0.2)
            except queue.Empty:
                if stop.is_set():
                    raise RunAborted(scenario.name) from None
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{scenario.name}: workers still running after {timeout}s")
                if not any(w.is_alive() for w in workers) and results.empty():
                    raise RuntimeError(f"{scenario.name}: a worker died without a result")
            else:
                if isinstance(records, BaseException):
                    raise RuntimeError(f"{scenario.name}: worker {index} failed") from records
                collected[index] = (records, cpu)
                windows.append(window)
            if progress is not None and time.monotonic() >= next_report:
                next_report += progress_interval
                progress(sum(counters[0::2]), sum(counters[1::2]), time.time() - go_at)
        wall = time.time() - go_at
        if progress is not None:
            progress(sum(counters[0::2]), sum(counters[1::2]), wall)
        for w in workers:
            w.join(timeout=10)
    finally:
        for w in workers:
            if w.is_alive():
                w.terminate()
    merged = [r for i in sorted(collected) for r in collected[i][0]]
    return RunResult(
        scenario=scenario.name,
        records=merged,
        processes=processes,
        wall_seconds=wall,
        cpu_seconds=sum(c for _, c in collected.values()),
        go_at=go_at,
        box_cpu_seconds=firing_window(windows),
    )


def firing_window(windows: Sequence[tuple[BoxCpu, BoxCpu]]) -> BoxCpu | None:
    """The box's (busy, total) CPU seconds over the union of the workers' firing windows (each
    read at its own start and end: the earliest start, the latest end)."""
    if not windows:
        return None
    start = min((w[0] for w in windows), key=lambda c: c[1])
    end = max((w[1] for w in windows), key=lambda c: c[1])
    return end[0] - start[0], end[1] - start[1]


def _get_or_fail(
    ready: Any, workers: list[Any], deadline: float, results: Any, stop: threading.Event
) -> None:
    while True:
        if stop.is_set():
            raise RunAborted("stopped while workers were preparing")
        try:
            ready.get(timeout=0.2)
            return
        except queue.Empty:
            if not results.empty():
                index, exc, *_ = results.get()
                raise RuntimeError(f"worker {index} failed while preparing") from exc
            if time.monotonic() > deadline or not all(w.is_alive() for w in workers):
                raise RuntimeError("a worker died or timed out while preparing")


def default_processes() -> int:
    """One worker per two cores: the rest of the machine serves the system under test."""
    return max(1, (os.cpu_count() or 2) // 2)


if __name__ == "__main__":
    from flashcoupon_loadtest.selftest import main

    sys.exit(main(sys.argv[1:]))
