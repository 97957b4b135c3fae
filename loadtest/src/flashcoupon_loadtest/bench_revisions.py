"""`make bench-revisions BEFORE=<rev>`: bench-gateway's paths for another revision's services and
this tree's, interleaved in one run, with after/before ratios.

    uv run python -m flashcoupon_loadtest.bench_revisions --before main~3 [--users 20000]
        [--rounds 2] [--paths issuer,gateway,soldout]

BEFORE is checked out once as a detached git worktree under .cache/bench-revisions/<sha12>
with its own `uv sync --frozen` (.venv), and reused by later runs. Its issuer and gateway start
from that venv's console scripts, this tree's from ours; the driver, the hello-world baseline,
the events (provisioned by this tree's flashcoupon_common.event_state) and the measurement are
this tree's, so the two sides differ only in the services' code. The subtle part: both
revisions must agree on the Redis layout of an event (keys, scripts); a revision that changed
it cannot be compared this way. Rounds alternate before/after per path, so a before-after
ratio comes from one run on one machine. Writes loadtest/results/bench-revisions.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from flashcoupon_loadtest import driver
from flashcoupon_loadtest.bench_gateway import (
    PathSpec,
    Started,
    chosen_paths,
    hello_path,
    run_paths,
    service_paths,
    start_hello,
    start_services,
)
from flashcoupon_loadtest.benchkit import publish, stop_all
from flashcoupon_loadtest.localrun import ROOT, git, stack_env
from flashcoupon_loadtest.rounds import DEFAULT_ROUNDS, Ratio

CHECKOUTS = ROOT / ".cache" / "bench-revisions"
KINDS = ("issuer", "gateway", "crowd", "soldout", "unbatched")
SIDES = ("before", "after")


def interleaved(kinds: list[str]) -> list[str]:
    """Path names in measuring order: hello, then each kind before and after side by side."""
    return ["hello", *(f"{side}:{kind}" for kind in kinds for side in SIDES)]


def revision_ratios(kinds: list[str]) -> dict[str, Ratio]:
    """after/before per kind, and each side's share of the hello-world baseline."""
    out = {f"{k} after/before": Ratio(f"after:{k}", f"before:{k}") for k in kinds}
    for side in SIDES:
        out |= {f"{side}: {k}/hello": Ratio(f"{side}:{k}", "hello") for k in kinds}
    return out


def _git(*args: str) -> str:
    return git(*args).strip()


def checkout(rev: str) -> Path:
    """`rev`'s tree with its own synced venv, under .cache/bench-revisions/<sha12>; its bin."""
    sha = _git("rev-parse", "--verify", f"{rev}^{{commit}}")
    where = CHECKOUTS / sha[:12]
    if not (where / "pyproject.toml").exists():
        CHECKOUTS.mkdir(parents=True, exist_ok=True)
        print(f"[bench-revisions] git worktree add --detach {where} {sha[:12]}", flush=True)
        _git("worktree", "add", "--detach", str(where), sha)
    # Its own environment: a VIRTUAL_ENV of ours (uv run) would make uv warn or use ours.
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    print(f"[bench-revisions] uv sync --frozen in {where}", flush=True)
    uv = [found] if (found := shutil.which("uv")) else ["python3", "-m", "uv"]  # as the Makefile
    subprocess.run([*uv, "sync", "--frozen", "--quiet"], cwd=where, env=env, check=True)
    return where / ".venv" / "bin"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench_revisions", description=__doc__.split("\n")[0])
    ap.add_argument("--before", required=True, help="git revision to compare this tree against")
    ap.add_argument("--users", type=int, default=20_000, help="shoppers per path per round")
    ap.add_argument(
        "--rounds", type=int, default=DEFAULT_ROUNDS, help="rounds per path, alternating"
    )
    ap.add_argument("--concurrency", type=int, default=64, help="driver connections")
    ap.add_argument("--processes", type=int, default=1, help="service processes per side")
    ap.add_argument("--drivers", type=int, default=driver.default_processes())
    ap.add_argument("--paths", default="issuer,gateway,soldout", help=f"subset of {KINDS}")
    args = ap.parse_args(argv)
    if not args.before.strip():
        ap.error("--before (make bench-revisions BEFORE=<git rev>) is required")
    kinds = chosen_paths(ap, args.paths, KINDS)

    before_bin = checkout(args.before)
    env = stack_env()
    started: dict[str, Started] = {}
    available: dict[str, PathSpec] = {}
    try:
        for side, bin_dir in (("before", before_bin), ("after", Path(sys.executable).parent)):
            procs = start_services(
                bin_dir,
                processes=args.processes,
                env=env,
                tag=side,
                unbatched="unbatched" in kinds,
            )
            started |= {f"{side}:{name}": s for name, s in procs.items()}
            available |= service_paths(procs, prefix=f"{side}:")
        started["hello"] = start_hello("revisions")
        available["hello"] = hello_path(started["hello"])
        paths = {name: available[name] for name in interleaved(kinds)}
        rounds = run_paths(
            paths,
            users=args.users,
            rounds=args.rounds,
            concurrency=args.concurrency,
            drivers=args.drivers,
            tag="bench-revisions",
        )
    finally:
        stop_all(s.proc for s in started.values())

    before_sha, after_sha = (
        _git("rev-parse", f"{args.before}^{{commit}}"),
        _git("rev-parse", "HEAD"),
    )
    dirty = bool(_git("status", "--short", "--untracked-files=no"))
    publish(
        "revisions",
        args,
        rounds,
        revision_ratios(kinds),
        {name: p.process for name, p in paths.items()},
        heading=[
            f"before = {args.before} ({before_sha[:12]}), after = this tree ({after_sha[:12]}"
            f"{', with uncommitted changes' if dirty else ''})"
        ],
        before={"rev": args.before, "sha": before_sha},
        after={"sha": after_sha, "uncommitted_changes": dirty},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
