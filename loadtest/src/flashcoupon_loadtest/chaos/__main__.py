"""`python -m flashcoupon_loadtest.chaos [--fault ROW[,ROW]] [--short]` (`make chaos`).

Starts a private stack (Redis Cluster, Kafka, MariaDB on free ports, never the shared
stack), runs each row, prints the table, writes loadtest/results/chaos.json and exits 1 when
a row failed (anything lost, duplicated, oversold, mismatched or wrongly answered).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from flashcoupon_loadtest.chaos.faults import FAULTS, SHORT_ROWS, Timing
from flashcoupon_loadtest.chaos.report import format_table, write_json
from flashcoupon_loadtest.chaos.runner import RowResult, git_commit, run_row
from flashcoupon_loadtest.chaos.stack import PrivateStack

RESULTS = Path(__file__).resolve().parents[3] / "results"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m flashcoupon_loadtest.chaos", description=__doc__)
    ap.add_argument("--fault", default="", help=f"rows, comma-separated: {', '.join(FAULTS)}")
    ap.add_argument("--short", action="store_true", help="short outages, small burst (test tier)")
    ap.add_argument("--out", type=Path, default=RESULTS / "chaos.json")
    ap.add_argument("--keep", action="store_true", help="keep the private stack's state dir")
    return ap.parse_args(argv)


async def run(args: argparse.Namespace) -> list[RowResult]:
    names = [n for n in args.fault.split(",") if n] or (
        list(SHORT_ROWS) if args.short else list(FAULTS)
    )
    unknown = [n for n in names if n not in FAULTS]
    if unknown:
        raise SystemExit(f"unknown row(s) {unknown}; known: {', '.join(FAULTS)}")
    timing = Timing.short() if args.short else Timing.full()
    stack = PrivateStack()
    began = time.monotonic()
    print(f"[chaos] private stack in {stack.state}: starting", flush=True)
    results: list[RowResult] = []
    try:
        await asyncio.to_thread(stack.start)
        print(f"[chaos] stack up in {time.monotonic() - began:.0f}s", flush=True)
        for name in names:
            t0 = time.monotonic()
            result = await run_row(stack, FAULTS[name], timing, stack.state / "rows")
            results.append(result)
            print(
                f"[chaos] {name}: {result.verdict} in {time.monotonic() - t0:.0f}s"
                + (f" ({result.error})" if result.error else ""),
                flush=True,
            )
        print(format_table(results))
        write_json(
            args.out,
            results,
            {
                "generated": datetime.now(UTC).isoformat(timespec="seconds"),
                "commit": git_commit(),
                "tier": "short" if args.short else "full",
                "timing": timing.__dict__,
                "seconds": round(time.monotonic() - began),
            },
        )
        print(f"[chaos] {args.out} written; {time.monotonic() - began:.0f}s in all")
    finally:
        failed = any(r.verdict == "FAIL" for r in results)
        keep = args.keep or failed
        await asyncio.to_thread(stack.stop, wipe=not keep)
        if keep:
            print(f"[chaos] state and service logs kept in {stack.state}")
    return results


def main(argv: list[str] | None = None) -> int:
    results = asyncio.run(run(parse_args(argv)))
    return 1 if any(r.verdict == "FAIL" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
