"""The arithmetic of a same-run comparison: round order, each path's median, ratios, the table.

bench_gateway, bench_servers and bench_revisions measure several paths (hello-world, the issuer
direct, through the gateway, ...) in alternating rounds so machine noise hits all of them, and
print ratios between paths rather than absolute rates: on a shared 2-core machine a ratio from
one run is reproducible where a req/s figure is not. No I/O here; tests/unit/test_bench_rounds.py.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Rounds per path when a benchmark is not told otherwise: an odd number, so a path's median is
# one measured round and a single disturbed round cannot move a ratio. With two, the "median"
# was their mean: one slow first round of a fresh gateway (83 against 42 µs of CPU per sold-out
# answer, 2026-11-28) took soldout/hello from 0.78 to 0.58 and failed its target.
DEFAULT_ROUNDS = 3


def round_orders(paths: Sequence[str], rounds: int) -> list[list[str]]:
    """Path order per round: as given in odd rounds, reversed in even ones, so no path always
    runs first (after an idle pause) or last (after the others warmed the caches)."""
    return [list(paths) if i % 2 == 0 else list(reversed(paths)) for i in range(rounds)]


def ceiling_rps(
    process_cpu_us: Iterable[float], driver_cpu_us: float, *, cpus: int
) -> float | None:
    """The req/s a path could reach on this box at its measured CPU per request if no process
    ever waited for another: every process it involves (the single-threaded services and Redis
    of `process_cpu_us`, and the load driver) shares the `cpus` cores, and none of the
    single-threaded ones gets more than one core. Only per-request CPU counts here, so a ratio of
    two ceilings is what a perfect pipeline could give: when a target stands above it, no
    scheduling or batching change reaches the target on this box, only less CPU per request.
    None when nothing was measured."""
    per_process = [c for c in process_cpu_us if c > 0]
    total = sum(per_process) + max(0.0, driver_cpu_us)
    if total <= 0:
        return None
    shared = cpus * 1e6 / total
    return round(min(shared, 1e6 / max(per_process)) if per_process else shared, 1)


def side(measurements: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One path's figures over its rounds: medians of req/s, latency and CPU per request, and of
    the box's ceiling (`ceiling_rps`), busy share (`box_busy`) and slowest answer (`max_ms`)
    when the rounds measured them."""
    if not measurements:
        raise ValueError("a path without measurements")
    cpu_names = sorted({n for m in measurements for n in m.get("cpu_us_per_request", {})})
    extra = {}
    for name, digits in (("ceiling_rps", 1), ("box_busy", 3), ("max_ms", 2)):
        values = [float(m[name]) for m in measurements if m.get(name)]
        if values:
            extra[name] = round(statistics.median(values), digits)
    return {
        "rounds": len(measurements),
        "rps": round(statistics.median(float(m["rps"]) for m in measurements), 1),
        "p50_ms": round(statistics.median(float(m["p50_ms"]) for m in measurements), 2),
        "p99_ms": round(statistics.median(float(m["p99_ms"]) for m in measurements), 2),
        "cpu_us_per_request": {
            name: round(
                statistics.median(
                    float(m["cpu_us_per_request"].get(name, 0.0)) for m in measurements
                ),
                1,
            )
            for name in cpu_names
        },
        **extra,
    }


def sides(rounds: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, dict[str, Any]]:
    return {path: side(ms) for path, ms in rounds.items() if ms}


@dataclass(frozen=True)
class Ratio:
    """`num`'s req/s over `den`'s; `target` is the least the issue asks for (None: none)."""

    num: str
    den: str
    target: float | None = None


def ratios(
    measured: Mapping[str, Mapping[str, Any]], wanted: Mapping[str, Ratio]
) -> dict[str, dict[str, Any]]:
    """Each wanted ratio whose two paths were measured: value, target, met; and `ceiling`, the
    ratio had `num` run at its `ceiling_rps` and `den` as measured, when `num` has one: the most
    any overlap of `num`'s processes could give against today's `den` (a target above it
    needs less CPU per request on `num`'s path)."""
    out: dict[str, dict[str, Any]] = {}
    for name, r in wanted.items():
        if r.num not in measured or r.den not in measured:
            continue
        den = float(measured[r.den]["rps"])
        value = round(float(measured[r.num]["rps"]) / den, 3) if den > 0 else None
        out[name] = {
            "value": value,
            "target": r.target,
            "met": None if r.target is None or value is None else value >= r.target,
        }
        num_ceiling = measured[r.num].get("ceiling_rps")
        if num_ceiling and den > 0:
            out[name]["ceiling"] = round(float(num_ceiling) / den, 3)
    return out


def table_lines(measured: Mapping[str, Mapping[str, Any]], cpu_of: Mapping[str, str]) -> list[str]:
    """One line per path: req/s, p50, p99, the CPU per request of the process `cpu_of[path]`
    names (the one that path measures: the gateway for gateway paths, hello for hello...), the
    path's box ceiling (`ceiling_rps`), the share of it reached and the share of the box's
    cores that were busy (`box_busy`)."""
    lines = [
        f"{'path':<24} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'CPU us/req':>11}"
        f" {'ceiling':>9} {'reached':>8} {'busy':>5}  (process)"
    ]
    for path, s in measured.items():
        proc = cpu_of.get(path, "")
        cpu = s["cpu_us_per_request"].get(proc)
        cell = "n/a" if cpu is None else f"{cpu:.1f}"
        top = s.get("ceiling_rps")
        ceiling, reached = ("n/a", "n/a") if not top else (f"{top:,.0f}", f"{s['rps'] / top:.2f}")
        busy_cell = share_cell(s.get("box_busy"))
        lines.append(
            f"{path:<24} {s['rps']:>9,.0f} {s['p50_ms']:>8.2f} {s['p99_ms']:>8.2f} {cell:>11}"
            f" {ceiling:>9} {reached:>8} {busy_cell:>5}  ({proc})"
        )
    return lines


def share_cell(share: float | None) -> str:
    """A 0..1 share as a table cell ("n/a" when it was not measured)."""
    return "n/a" if share is None else f"{share:.2f}"


def ratio_lines(computed: Mapping[str, Mapping[str, Any]]) -> list[str]:
    lines = []
    for name, r in computed.items():
        value = "n/a" if r["value"] is None else f"{r['value']:.2f}"
        verdict = (
            ""
            if r["target"] is None
            else (f"  (target >= {r['target']:.2f}: {'met' if r['met'] else 'NOT met'})")
        )
        ceiling = "" if r.get("ceiling") is None else f"  [at its box ceiling {r['ceiling']:.2f}]"
        lines.append(f"  {name:<28} {value}{verdict}{ceiling}")
    return lines
