"""What one demo drop reports: its progress line, the Idempotency-Key replay check, the JSON.

Built from the driver's records, the pipeline watch's samples (wall time, Redis issued, MySQL
rows) and the invariant checks; `demo.py` runs the drop, this module only computes. The subtle
part is the drain figures: they are measured from the last answer (or the sell-out) to the
first sample where MySQL held every coupon Redis finally issued — not to when the watch stopped.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from flashcoupon_loadtest.cpu_watch import CpuSample, phase_cpu, window_cpu
from flashcoupon_loadtest.driver import Progress
from flashcoupon_loadtest.drop import PipelineWatch
from flashcoupon_loadtest.invariants import Check, all_passed
from flashcoupon_loadtest.stats import (
    retry_mismatches,
    split_retry_mismatches,
    summarize,
    time_series,
)

Sample = tuple[float, int, int]  # (wall time, Redis issued, MySQL rows)
BASELINE_TARGET = 0.40  # issue 13, goal 5: answers/s at least this share of hello-world's


def progress_line(watch: PipelineWatch, quantity: int) -> Progress:
    """The burst's one-line progress (rewritten in place on a terminal)."""
    tty = sys.stdout.isatty()
    last = [0, 0.0]

    def show(answers: int, issued: int, seconds: float) -> None:
        rate = (answers - last[0]) / max(1e-6, seconds - last[1])
        last[0], last[1] = answers, seconds
        persisted = watch.last[2]
        line = (
            f"  [{seconds:6.1f}s] answers {answers:>9,} ({rate:>7,.0f}/s)  issued "
            f"{issued:>7,}/{quantity:,}  persisted {persisted:>7,}"
        )
        print("\r" + line if tty else line, end="" if tty else "\n", flush=True)

    return show


def replay_check(records: Sequence[Any]) -> Check:
    """Invariant 6: a replayed Idempotency-Key gets the first answer, never DUPLICATE."""
    contradicted, stale = split_retry_mismatches(retry_mismatches(records))
    return Check(
        6,
        "Idempotency-Key replays never get DUPLICATE or another coupon",
        not contradicted,
        f"{sum(1 for r in records if r.kind == 'retry'):,} replays, {len(contradicted)} "
        f"contradicted the first answer; {len(stale)} answered a stale SOLD_OUT "
        "(replay reached another issuer after the sell-out; the coupon is held)",
        [f"{u} was issued {c}, replay got {got}" for u, c, got in (contradicted + stale)[:5]],
    )


def drop_report(
    args: argparse.Namespace,
    *,
    event_id: str,
    t_begin: float,
    targets: list[str],
    records: Sequence[Any],
    driver_cpu_seconds: float,
    samples: list[Sample],
    drained: bool,
    redis_issued: int,
    persisted: int,
    checks: list[Check],
    hello: Mapping[str, Any] | None = None,
    peak_rss: Mapping[str, float | None] | None = None,
    cpu_samples: Sequence[CpuSample] = (),
    services: Collection[str] = (),
    redis_calls: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    summary = summarize(records, quantity=args.coupons)
    go, burst_end = min(r.t_start for r in records), max(r.t_end for r in records)
    sold_out = None if summary["sell_out_seconds"] is None else go + summary["sell_out_seconds"]
    return {
        "event_id": event_id,
        "started": datetime.fromtimestamp(t_begin, UTC).isoformat(),
        "users": args.users,
        "coupons": args.coupons,
        "concurrency": args.concurrency,
        "processes": args.processes,
        "targets": targets,
        "summary": summary,
        "burst_seconds": burst_end - min(r.t_start for r in records),
        # Answers by HTTP status (0: none) and the series' origin: the chaos rows read both.
        "statuses": dict(sorted(Counter(str(r.status) for r in records).items())),
        "t0": min(r.t_start for r in records),
        # From the last answer until MySQL held everything (0 when it already did by then).
        "drain_seconds": max(0.0, all_persisted_at(samples) - burst_end) if drained else None,
        "persisted_after_sell_out_seconds": persisted_after(summary, records, samples),
        "redis_issued": redis_issued,
        "persisted": persisted,
        "driver_cpu_seconds": driver_cpu_seconds,
        "wall_seconds": time.time() - t_begin,
        "baseline": baseline(summary["throughput_rps"], hello),
        # Peak resident memory (VmHWM, MiB) of every process the demo started, read at the end.
        "peak_rss_mib": dict(peak_rss) if peak_rss is not None else None,
        # Each service process's CPU from the go to the last answer: which one the burst waits on.
        "burst_cpu": (
            window_cpu(cpu_samples, go, burst_end, answers=len(records), names=services)
            if len(cpu_samples) > 1 and services
            else None
        ),
        # Every process's (the stack's servers and the driver too) in each phase of the drop.
        "phase_cpu": phase_cpu(
            cpu_samples,
            go=go,
            sold_out=sold_out,
            end=burst_end,
            answer_times=[r.t_end for r in records],
        ),
        # Each Redis server's busiest commands from the go to the last answer (redis_calls).
        "redis_calls": dict(redis_calls) if redis_calls is not None else None,
        "invariants": [c.to_json() for c in checks],
        "passed": all_passed(checks),
        "pipeline": samples,
        "series": time_series(records, bucket=0.1),
        "args": {k: str(v) for k, v in vars(args).items()},
    }


def baseline(answers_rps: float, hello: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The drop's answers/s as a share of the same driver's hello-world rate in the same run.

    `hello` is benchkit.measure's result for the hello-world round (None: not measured).
    """
    if hello is None:
        return None
    hello_rps = float(hello["rps"])
    ratio = answers_rps / hello_rps if hello_rps > 0 else None
    return {
        "answers_rps": round(answers_rps, 1),
        "hello_rps": round(hello_rps, 1),
        "ratio": None if ratio is None else round(ratio, 3),
        "target": BASELINE_TARGET,
        "met": ratio is not None and ratio >= BASELINE_TARGET,
        "hello": dict(hello),
    }


def persisted_after(
    summary: dict[str, Any], records: Sequence[Any], samples: list[Sample]
) -> float | None:
    """Seconds from the last coupon's answer until MySQL held every issued coupon."""
    if summary["sell_out_seconds"] is None or not samples:
        return None
    sold_out_at = min(r.t_start for r in records) + float(summary["sell_out_seconds"])
    return float(max(0.0, float(all_persisted_at(samples)) - sold_out_at))


def all_persisted_at(samples: list[Sample]) -> float:
    """When MySQL first held as many rows as Redis finally issued (the last sample if never)."""
    final = samples[-1][1]
    return next((t for t, _, persisted in samples if persisted >= final), samples[-1][0])
