"""A load run's report: the text printed at the end, the JSON file and the PNG plot."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flashcoupon_loadtest.invariants import Check, format_checks
from flashcoupon_loadtest.stats import FAIRNESS_TARGET, Record, p99_target_ms, time_series


def _ms(v: float) -> str:
    return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:,.1f} ms"


def _s(v: float | None) -> str:
    return "n/a" if v is None else f"{v:,.2f} s"


def _ratio(f: dict[str, float]) -> float:
    """A phase's max/p50; NaN when it had no answers (None once written as strict JSON)."""
    r = f.get("ratio")
    return math.nan if r is None else float(r)


def fairness_lines(fair: dict[str, dict[str, float]] | None) -> list[str]:
    """max/p50 over the run and per phase (stats.fairness), against the 10x target."""
    if not fair:
        return []
    parts = [
        f"{name.replace('_', '-')} {_ratio(f):.1f}x ({_ms(f['max'])} / {_ms(f['p50'])})"
        for name, f in fair.items()
    ]
    phases = [_ratio(f) for name, f in fair.items() if name != "run"]
    if _ratio(fair["run"]) <= FAIRNESS_TARGET:
        verdict = "met"
    elif phases and all(r <= FAIRNESS_TARGET for r in phases):
        verdict = "NOT met over the run, met within each phase"
    else:
        verdict = "NOT met"
    return [f"  max/p50       {', '.join(parts)} (target <= {FAIRNESS_TARGET:.0f}x: {verdict})"]


def format_report(report: dict[str, Any], checks: Sequence[Check]) -> str:
    s = report["summary"]
    lat = s["latency_ms"]
    p99_goal = p99_target_ms(report["concurrency"])
    p99_met = isinstance(lat["p99"], float) and lat["p99"] < p99_goal
    lines = [
        "",
        f"flashcoupon demo — event {report['event_id']}: {report['users']:,} shoppers, "
        f"{report['coupons']:,} coupons, concurrency {report['concurrency']}, "
        f"{report['processes']} driver process(es), targets {', '.join(report['targets'])}",
        "",
        f"  requests      {s['requests']:,} ({s['answered']:,} answered)",
        "  outcomes      " + ", ".join(f"{k} {v:,}" for k, v in s["outcomes"].items()),
    ]
    for kind, counts in s["outcomes_by_kind"].items():
        lines.append(f"    {kind:<11} " + ", ".join(f"{k} {v:,}" for k, v in counts.items()))
    lines += [
        f"  throughput    {s['throughput_rps']:,.0f} answers/s over {_s(report['burst_seconds'])}",
        f"  latency       p50 {_ms(lat['p50'])}, p95 {_ms(lat['p95'])}, p99 {_ms(lat['p99'])}, "
        f"max {_ms(lat['max'])} (target p99 < {p99_goal:.0f} ms at concurrency "
        f"{report['concurrency']}: {'met' if p99_met else 'NOT met'})",
        *fairness_lines(s.get("fairness")),
        f"  sold out in   {_s(s['sell_out_seconds'])} (first press to the last coupon's answer)",
        f"  drain time    {_s(report['drain_seconds'])} (last answer to MySQL = Redis issued: "
        f"{report['persisted']:,} / {report['redis_issued']:,}); all persisted "
        f"{_s(report.get('persisted_after_sell_out_seconds'))} after the last coupon's answer",
        f"  retries       {s['retry_contradictions']} Idempotency-Key replays contradicted their "
        f"first answer; {s['retry_stale_sold_out']} got a stale SOLD_OUT (see invariant 6)",
        *baseline_lines(report.get("baseline"), report.get("peak_rss_mib")),
        *cpu_lines(report.get("burst_cpu")),
        *phase_cpu_lines(report.get("phase_cpu")),
        *redis_call_lines(report.get("redis_calls")),
        f"  driver        {report['driver_cpu_seconds']:.1f} CPU-s for {s['requests']:,} requests "
        f"({report['driver_cpu_seconds'] / max(1e-9, report['burst_seconds']):.0%} of one core "
        "during the burst)",
        f"  wall time     {_s(report['wall_seconds'])} (services up, event applied, burst, drain, "
        "checks)",
        "",
        "invariants (checked against Redis and MySQL directly):",
        format_checks(checks),
        "",
        f"RESULT: {'PASS' if report['passed'] else 'FAIL'}",
    ]
    return "\n".join(lines)


def baseline_lines(
    baseline: dict[str, Any] | None, peak_rss_mib: dict[str, float | None] | None
) -> list[str]:
    """The report's hello-world baseline and per-process peak memory lines (when measured)."""
    lines = []
    if baseline is not None:
        ratio = "n/a" if baseline["ratio"] is None else f"{baseline['ratio']:.2f}"
        hello = baseline["hello"]
        lines.append(
            f"  baseline      answers/s {baseline['answers_rps']:,.0f} = {ratio} of hello-world "
            f"{baseline['hello_rps']:,.0f} (same driver, same run; target >= "
            f"{baseline['target']:.2f}: {'met' if baseline['met'] else 'NOT met'}); hello-world "
            f"p99 {_ms(hello.get('p99_ms'))}, {hello.get('requests', 0):,} requests, 1 process"
        )
    if peak_rss_mib:
        cells = [
            f"{name} {'n/a' if mib is None else f'{mib:,.1f}'}"
            for name, mib in peak_rss_mib.items()
        ]
        lines.append("  peak RSS      " + ", ".join(cells) + " MiB (VmHWM per process)")
    return lines


def cpu_lines(burst_cpu: dict[str, dict[str, float]] | None) -> list[str]:
    """Per service process: CPU from the go to the last answer, as a share of one core."""
    if not burst_cpu:
        return []
    cells = [
        f"{name} {c['cpu_seconds']:.1f} s ({c['core_share']:.0%} of a core, "
        f"{c['us_per_answer']:.0f} us/answer)"
        for name, c in burst_cpu.items()
    ]
    return ["  burst CPU     " + ", ".join(cells)]


def phase_cpu_lines(phases: dict[str, dict[str, Any]] | None) -> list[str]:
    """Per phase of the drop: the box's busy cores and what each role took of them."""
    rows = []
    for phase, p in (phases or {}).items():
        roles = ", ".join(f"{name} {cores:.2f}" for name, cores in p["cores"].items())
        busy = "n/a" if p["box_cores"] is None else f"{p['box_cores']:.2f}"
        rows.append(
            f"{phase.replace('_', '-')} {_s(p['seconds'])}, {p['answers']:,} answers, "
            f"{busy} cores busy: {roles}"
        )
    return _labelled("phase CPU", rows)


def redis_call_lines(servers: dict[str, dict[str, Any]] | None, *, top: int = 3) -> list[str]:
    """Per Redis server, busiest first: its role and its busiest commands during the burst."""
    rows = []
    for node, s in (servers or {}).items():
        calls = ", ".join(
            f"{name} {c['calls']:,} x {c['usec_per_call']:.1f} us"
            for name, c in list(s["commands"].items())[:top]
        )
        rows.append(f"{node} {s['role']}: {calls}")
    return _labelled("redis calls", rows)


def _labelled(label: str, rows: list[str]) -> list[str]:
    """The report's block of several lines: the label in the first, the rest indented under it."""
    return [f"  {label if i == 0 else '':<14}{row}" for i, row in enumerate(rows)]


def _clean(value: Any) -> Any:
    """NaN/inf (no samples) become null: strict JSON has no NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def write_json(path: Path, report: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_clean(report), indent=2, default=str, allow_nan=False))


def plot(
    path: Path,
    records: Sequence[Record],
    pipeline: Sequence[tuple[float, int, int]],
    *,
    go_at: float,
    title: str,
) -> None:
    """Latency over time (p50/p99 per 100 ms) above issued/persisted over time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = time_series(records, bucket=0.1)
    t0 = min((r.t_start for r in records), default=go_at)
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    xs = [b["t"] for b in series]
    ax1.plot(xs, [b["p50_ms"] for b in series], label="p50")
    ax1.plot(xs, [b["p99_ms"] for b in series], label="p99")
    ax1.set_ylabel("latency (ms)")
    ax1.set_yscale("log")
    ax1.grid(True, which="both", alpha=0.3)
    ax1.legend()
    ax1.set_title(title)
    ax2.plot(xs, [b["issued"] for b in series], label="issued (201 answers)")
    if pipeline:
        ax2.plot(
            [t - t0 for t, _, _ in pipeline],
            [r for _, r, _ in pipeline],
            label="issued (Redis counter)",
            linestyle=":",
        )
        ax2.plot(
            [t - t0 for t, _, _ in pipeline],
            [m for _, _, m in pipeline],
            label="persisted (MySQL rows)",
        )
    ax2.set_xlabel("seconds since the first press")
    ax2.set_ylabel("coupons")
    ax2.grid(True, alpha=0.3)
    ax2.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
