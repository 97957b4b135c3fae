"""The arithmetic of a same-run comparison: round order, each path's median, ratios, the table.

bench_gateway, bench_servers and bench_revisions measure several paths (hello-world, the issuer
direct, through the gateway, ...) in alternating rounds so machine noise hits all of them, and
print ratios between paths rather than absolute rates: on a shared 2-core machine a ratio from
one run is reproducible where a req/s figure is not. No I/O here; tests/unit/test_bench_rounds.py.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


def round_orders(paths: Sequence[str], rounds: int) -> list[list[str]]:
    """Path order per round: as given in odd rounds, reversed in even ones, so no path always
    runs first (after an idle pause) or last (after the others warmed the caches)."""
    return [list(paths) if i % 2 == 0 else list(reversed(paths)) for i in range(rounds)]


def side(measurements: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One path's figures over its rounds: medians of req/s, latency and CPU per request."""
    if not measurements:
        raise ValueError("a path without measurements")
    cpu_names = sorted({n for m in measurements for n in m.get("cpu_us_per_request", {})})
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
    """Each wanted ratio whose two paths were measured: value, target, met."""
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
    return out


def table_lines(measured: Mapping[str, Mapping[str, Any]], cpu_of: Mapping[str, str]) -> list[str]:
    """One line per path: req/s, p50, p99 and the CPU per request of the process `cpu_of[path]`
    names (the one that path measures: the gateway for gateway paths, hello for hello...)."""
    lines = [f"{'path':<24} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'CPU us/req':>11}  (process)"]
    for path, s in measured.items():
        proc = cpu_of.get(path, "")
        cpu = s["cpu_us_per_request"].get(proc)
        cell = "n/a" if cpu is None else f"{cpu:.1f}"
        lines.append(
            f"{path:<24} {s['rps']:>9,.0f} {s['p50_ms']:>8.2f} {s['p99_ms']:>8.2f} {cell:>11}  "
            f"({proc})"
        )
    return lines


def ratio_lines(computed: Mapping[str, Mapping[str, Any]]) -> list[str]:
    lines = []
    for name, r in computed.items():
        value = "n/a" if r["value"] is None else f"{r['value']:.2f}"
        verdict = (
            ""
            if r["target"] is None
            else (f"  (target >= {r['target']:.2f}: {'met' if r['met'] else 'NOT met'})")
        )
        lines.append(f"  {name:<28} {value}{verdict}")
    return lines
