"""`make bench`: every service benchmark plus the end-to-end burst, one table.

    uv run python -m flashcoupon_loadtest.bench_all \
        [--only driver,issuer,master,persister,gateway,relay,wallet,e2e]

Each benchmark runs as its own process, one after the other (they would skew each other on a
shared machine), and writes its JSON under loadtest/results/; this module reads what each
wrote during its run and prints the figures that matter — throughput, latency percentiles and
the ratios the targets are stated in — then the end-to-end burst (the demo) with its
invariant verdict. The combined table is written to loadtest/results/bench_all.json.
Exits non-zero when a benchmark failed or the burst broke an invariant.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parents[2] / "results"
# name: (python -m arguments, the JSON file it writes under RESULTS)
BENCHES = {
    # The driver's own ceiling first: every other figure is only as good as the load behind it.
    "driver": (["flashcoupon_loadtest.driver", "--selftest"], "driver_selftest.json"),
    "issuer": (["flashcoupon_loadtest.bench_issuer"], "bench-issuer.json"),
    "master": (["flashcoupon_loadtest.bench_master"], "bench-master.json"),
    "persister": (["flashcoupon_loadtest.bench_persister"], "bench-persister.json"),
    "gateway": (["flashcoupon_loadtest.bench_gateway"], "bench-gateway.json"),
    "relay": (["flashcoupon_loadtest.bench_relay"], "bench-relay.json"),
    "wallet": (["flashcoupon_loadtest.bench_wallet"], "bench-wallet.json"),
}
# Figures written by a step run on its own (the issuer's memory probe): shown from their
# latest file, with its age, not re-run here.
WRITTEN_ELSEWHERE = {"memory": "memory-probe.json"}
# Leaf names worth a row in the table: rates, latencies, ratios, sizes, durations.
INTERESTING = (
    "rps",
    "per_s",
    "per_second",
    "ratio",
    "p50",
    "p95",
    "p99",
    "rows",
    "seconds",
    "lag",
    "mb",
    "bytes_per",
    "cpu",
    "throughput",
    "ceiling",
    "target",
)


# Subtrees that repeat the summary per round/sample, or describe the set-up.
SKIP = frozenset({"rounds", "samples", "series", "pipeline", "settings", "args", "load_average"})


def interesting_leaves(data: Any, prefix: str = "", depth: int = 0) -> list[tuple[str, float]]:
    """(dotted path, number) of the leaves whose name says rate/latency/ratio, in file order."""
    out: list[tuple[str, float]] = []
    if depth > 4:
        return out
    if isinstance(data, dict):
        for key, value in data.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            if key in SKIP:
                continue
            if isinstance(value, dict | list):
                out += interesting_leaves(value, path, depth + 1)
            elif (
                isinstance(value, int | float)
                and not isinstance(value, bool)
                and any(word in path.lower() for word in INTERESTING)
            ):
                out.append((path, float(value)))
    elif isinstance(data, list) and len(data) <= 20:
        for i, value in enumerate(data):
            label: object = i
            if isinstance(value, dict):
                names = [value[k] for k in ("name", "mode", "side", "path") if k in value]
                label = f"{i}:{names[0]}" if names else i
            out += interesting_leaves(value, f"{prefix}[{label}]", depth + 1)
    return out


def run_bench(name: str, module: list[str], filename: str, timeout: float) -> dict[str, Any]:
    started = time.time()
    print(f"\n=== bench {name}: python -m {' '.join(module)}", flush=True)
    try:
        proc = subprocess.run([sys.executable, "-m", *module], timeout=timeout, check=False)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        code = -1
    path = RESULTS / filename
    rows: list[tuple[str, float]] = []
    if not path.exists() or path.stat().st_mtime < started:
        rows.append((f"{filename} not written by this run", float("nan")))
        code = code or 1
    else:
        try:
            rows = interesting_leaves(json.loads(path.read_text()))
        except (OSError, ValueError) as exc:
            rows.append((f"{filename} unreadable ({exc})", float("nan")))
    return {
        "bench": name,
        "exit": code,
        "seconds": time.time() - started,
        "file": filename,
        "rows": rows,
    }


def read_written(name: str, filename: str) -> dict[str, Any] | None:
    path = RESULTS / filename
    if not path.exists():
        return None
    age = time.time() - path.stat().st_mtime
    try:
        rows = interesting_leaves(json.loads(path.read_text()))
    except (OSError, ValueError) as exc:
        rows = [(f"{filename} unreadable ({exc})", float("nan"))]
    return {
        "bench": name,
        "exit": 0,
        "seconds": 0.0,
        "file": filename,
        "rows": rows,
        "note": f"from {filename}, written {age / 60:.0f} min ago",
    }


def run_e2e(users: int, coupons: int, timeout: float) -> dict[str, Any]:
    started = time.time()
    print(f"\n=== end-to-end burst: {users:,} shoppers at {coupons:,} coupons", flush=True)
    cmd = [
        sys.executable,
        "-m",
        "flashcoupon_loadtest.demo",
        "--users",
        str(users),
        "--coupons",
        str(coupons),
        "--cleanup",
    ]
    try:
        code = subprocess.run(cmd, timeout=timeout, check=False).returncode
    except subprocess.TimeoutExpired:
        code = -1
    path = RESULTS / "demo.json"
    if not path.exists() or path.stat().st_mtime < started:
        return {"bench": "e2e", "exit": code, "seconds": time.time() - started, "rows": []}
    r = json.loads(path.read_text())
    s, lat = r["summary"], r["summary"]["latency_ms"]
    rows = [
        ("answers/s", s["throughput_rps"]),
        ("latency p50 ms", lat["p50"]),
        ("latency p99 ms", lat["p99"]),
        ("latency max ms", lat["max"]),
        ("p99 / 100 ms target", (lat["p99"] or 0) / 100),
        ("sold out in s", s["sell_out_seconds"]),
        ("drain s", r["drain_seconds"]),
        ("invariants passed", float(all(c["verdict"] == "PASS" for c in r["invariants"]))),
        # Issue 13 goal 5: the same driver's hello-world rate, measured in the demo's own run.
        ("answers/s / hello-world (same run)", (r.get("baseline") or {}).get("ratio")),
        ("wall s", r["wall_seconds"]),
    ]
    selftest = RESULTS / "driver_selftest.json"
    if selftest.exists():
        ceiling = json.loads(selftest.read_text())["results"]["raw_1proc"]["ceiling_rps_per_core"]
        rows.append(("answers/s / driver ceiling per core", s["throughput_rps"] / ceiling))
    return {
        "bench": "e2e",
        "exit": code,
        "seconds": time.time() - started,
        "file": "demo.json",
        "rows": rows,
    }


def _fmt(value: float | None) -> str:
    if value is None or value != value:  # None or NaN: no figure
        return "n/a"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:,.3f}".rstrip("0").rstrip(".")


def print_table(results: list[dict[str, Any]]) -> None:
    print("\n" + "=" * 78)
    print(f"{'benchmark':<11}{'figure':<55}{'value':>12}")
    print("-" * 78)
    for res in results:
        status = "ok" if res["exit"] == 0 else f"FAILED (exit {res['exit']})"
        seconds = res["seconds"]
        head = f"[{res.get('note') or f'{status}, {seconds:.0f}s'}]"
        print(f"{res['bench']:<11}{head:<55}")
        for label, value in res["rows"]:
            shown = _fmt(value)
            label = label.removeprefix("results.")
            print(f"{'':<11}{label[:54]:<55}{shown:>12}")
    print("=" * 78)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m flashcoupon_loadtest.bench_all")
    ap.add_argument(
        "--only",
        default=",".join([*BENCHES, "e2e"]),
        help=f"comma-separated subset of {','.join([*BENCHES, 'e2e'])}",
    )
    ap.add_argument("--e2e-users", type=int, default=100_000)
    ap.add_argument("--e2e-coupons", type=int, default=10_000)
    ap.add_argument("--timeout", type=float, default=900.0, help="per benchmark, seconds")
    args = ap.parse_args(argv)
    wanted = [w.strip() for w in args.only.split(",") if w.strip()]
    unknown = set(wanted) - {*BENCHES, "e2e"}
    if unknown:
        ap.error(f"unknown benchmark(s): {', '.join(sorted(unknown))}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    results = [run_bench(n, *BENCHES[n], args.timeout) for n in BENCHES if n in wanted]
    results += [r for n, f in WRITTEN_ELSEWHERE.items() if (r := read_written(n, f)) is not None]
    if "e2e" in wanted:
        results.append(run_e2e(args.e2e_users, args.e2e_coupons, args.timeout))
    print_table(results)
    out = RESULTS / "bench_all.json"
    out.write_text(json.dumps(results, indent=2, default=str))
    print(f"written {out}")
    return 0 if all(r["exit"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
