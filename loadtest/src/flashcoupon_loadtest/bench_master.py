"""`make bench-master`: what issue.lua costs the event's Redis master per issue, and where it goes.

    uv run python -m flashcoupon_loadtest.bench_master [--issues 40000] [--per-call 32]
        [--repeats 3] [--against REV]

issue.lua is sent straight to the master that owns a fresh event's slot (no issuer, no HTTP) as
EVALSHA calls of --per-call presses, each press a new shopper (with no allowance but in the
`allowance` variant), 16 calls per pipeline, and the master's own CPU (/proc utime + stime) is
read before and after: its CPU per issue. On a two-core box that CPU is taken from what the
issuer's path could use (the benchmarks' box ceiling, docs/loadtest.md), so it bounds
issuer/hello as much as the issuer's own does. So does the master's replica, which applies
every write the script makes: its CPU per issue is read the same way, once it has caught up
with the master (`replica us` in the table).

Variants of the script, each loaded under its own sha and measured in turn in every repeat (the
machine's noise hits all of them), say what one part costs: most are issue.lua with that part
cut (their codes are wrong on purpose). Each runs on an event of its own, deleted afterwards.

  as-is          issue.lua as deployed: the baseline of every ratio
  one-per-call   as-is, one press per call: what deciding a batch's presses in one call saves
  allowance      as-is, each press carrying the shopper's allowance (an event's default
                 per-shopper limit), as a gateway's press does: what deciding it here costs
  single-tier    as-is, on an event of one tier (which skips the tier draw's hash)
  no-code-hash   the code's keyed Feistel rounds without their redis.sha1hex (f = R)
  no-hashes      that, and the tier draw without its hash (r = seq % total)
  no-outbox      no XADD of the outbox entry
  no-holdings    no HSET of the shopper's holdings
  at REV         with --against REV: issue.lua as it was at that git revision, so a change to
                 the script is measured against its predecessor in one run

A cut is a text replacement that must match issue.lua exactly once: when the script changes so
that one no longer matches, the run stops and names the variant (tests/unit/test_bench_master.py
holds every cut against the deployed script). Writes loadtest/results/bench-master.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import redis.asyncio as aioredis
from flashcoupon_common import event_state, keys
from flashcoupon_common.event_spec import AdmissionSpec, TierSpec
from flashcoupon_common.lua import ISSUE
from flashcoupon_common.redis_cluster import create_redis_cluster
from flashcoupon_common.settings import RedisSettings
from flashcoupon_gateway import gcra
from flashcoupon_issuer.app import press_argv
from redis.asyncio.cluster import RedisCluster

from flashcoupon_loadtest.benchkit import (
    ONE_TIER,
    RESULTS,
    TWO_TIERS,
    bench_spec,
    event_master,
    running_here,
)
from flashcoupon_loadtest.localrun import git, stack_env
from flashcoupon_loadtest.procstat import cpu_seconds
from flashcoupon_loadtest.rounds import share_cell

PIPELINE = 16  # calls per pipeline: the issuer keeps up to 4 batches on the wire per node
_CODE_HASH = "tonumber(string.sub(redis.sha1hex(round_key[rnd] .. R), 1, 7), 16)"
_TIER_HASH = "tonumber(string.sub(redis.sha1hex(tier_key .. seq), 1, 12), 16)"
_XADD = "redis.call('XADD', KEYS[4], '*', 'v', table.concat({"


@dataclass(frozen=True)
class Variant:
    name: str
    cuts: tuple[tuple[str, str], ...] = ()  # (text of issue.lua, what replaces it)
    script: str | None = None  # another issue.lua in place of the deployed one (--against)
    per_call: int | None = None  # presses per call; None: the run's --per-call
    tiers: tuple[TierSpec, ...] = TWO_TIERS  # the event's tiers
    # Each press carries the shopper's allowance (a gateway's press): what deciding the
    # shopper's rate limit in the issue call costs the master and its replica.
    allowance: bool = False

    def source(self, script: str) -> str:
        """issue.lua (or this variant's own) with its cuts; ValueError when one does not match
        exactly once."""
        script = self.script or script
        for old, new in self.cuts:
            found = script.count(old)
            if found != 1:
                raise ValueError(
                    f"variant {self.name}: {old!r} occurs {found} times in issue.lua, not once"
                )
            script = script.replace(old, new)
        return script


VARIANTS = (
    Variant("as-is"),
    Variant("one-per-call", per_call=1),
    Variant("allowance", allowance=True),
    Variant("single-tier", tiers=ONE_TIER),
    Variant("no-code-hash", ((_CODE_HASH, "R"),)),
    Variant("no-hashes", ((_CODE_HASH, "R"), (_TIER_HASH, "seq"))),
    Variant("no-outbox", ((_XADD, "local _ = {"), ("tp, user}, '\\31'))", "tp, user}"))),
    Variant("no-holdings", (("redis.call('HSET', KEYS[3], user, entry)", "local _ = entry"),)),
)


ISSUE_LUA = "libs/common/src/flashcoupon_common/lua/issue.lua"  # in the repository


def revision_variant(rev: str) -> Variant:
    """issue.lua as committed at `rev` (git show), to measure beside this tree's."""
    try:
        script = git("show", f"{rev}:{ISSUE_LUA}")
    except subprocess.CalledProcessError as exc:
        raise ValueError(f"--against {rev}: {exc.stderr.strip() or 'git show failed'}") from None
    return Variant(f"at {rev}", script=script)


# What a gateway sends with a press of an event with the default per-shopper limit.
_DEFAULTS = AdmissionSpec()
_PER_USER = gcra.limit(_DEFAULTS.per_user_per_second, _DEFAULTS.per_user_burst)
ALLOWANCE = (_PER_USER.interval_us, _PER_USER.burst)


def press_calls(
    issues: int, per_call: int, tag: str, *, allowance: bool = False
) -> list[list[str]]:
    """issue.lua's ARGV for `issues` new shoppers, `per_call` presses per call (the last call
    may hold fewer): user id, request id, no traceparent, and no allowance unless `allowance`
    (then ALLOWANCE, as a gateway's press carries it), laid out by the issuer's own
    `press_argv`."""
    limit = ALLOWANCE if allowance else None
    calls: list[list[str]] = []
    for first in range(0, issues, per_call):
        argv: list[str] = []
        for i in range(first, min(first + per_call, issues)):
            argv += map(str, press_argv(f"{tag}-u{i}", f"{tag}-r{i}", "", limit))
        calls.append(argv)
    return calls


class Cost(NamedTuple):
    master_us: float  # the event's master's CPU per issue
    replica_us: float  # its replica's


async def replica_of(master: aioredis.Redis) -> tuple[aioredis.Redis, int]:
    """A client of the master's (first) replica and the replica's pid."""
    info = await master.info("replication")
    replica = info.get("slave0")
    if not isinstance(replica, dict):
        raise SystemExit(f"the event's Redis master has no replica: {info}")
    client = aioredis.Redis(host=replica["ip"], port=int(replica["port"]))
    return client, running_here(int((await client.info("server"))["process_id"]))


async def caught_up(master: aioredis.Redis, replica: aioredis.Redis, within: float = 30) -> None:
    """Return once the replica has applied everything the master has written so far."""
    target = int((await master.info("replication"))["master_repl_offset"])
    deadline = time.monotonic() + within
    while int((await replica.info("replication"))["slave_repl_offset"]) < target:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the replica did not reach offset {target} within {within} s")
        await asyncio.sleep(0.01)


async def cost_per_issue(
    client: RedisCluster, variant: Variant, issues: int, per_call: int
) -> Cost:
    """Microseconds of the master's and its replica's CPU per issue for `variant`, on an event
    of its own."""
    # The event id is a DNS label: a revision's name ("at main~3") in its characters.
    slug = re.sub(r"[^a-z0-9]+", "-", variant.name.lower()).strip("-")[:40]
    tag = f"{slug}-{os.urandom(3).hex()}"
    event_id = f"bench-master-{tag}"
    spec = bench_spec(event_id, issues + 1, tiers=variant.tiers)  # never sells out
    await event_state.provision(client, spec)
    try:
        node, pid = await event_master(client, event_id)
        master = aioredis.Redis(host=node.host, port=int(node.port))
        replica, replica_pid = await replica_of(master)
        try:
            sha = await master.script_load(variant.source(ISSUE.source))
            event_keys = keys.issue_keys(event_id)
            calls = press_calls(
                issues, variant.per_call or per_call, tag, allowance=variant.allowance
            )
            await caught_up(master, replica)
            before, replica_before = cpu_seconds(pid), cpu_seconds(replica_pid)
            issued = 0
            for start in range(0, len(calls), PIPELINE):
                pipe = master.pipeline(transaction=False)
                for argv in calls[start : start + PIPELINE]:
                    pipe.evalsha(sha, len(event_keys), *event_keys, *argv)
                for replies in await pipe.execute():
                    issued += sum(1 for reply in replies if reply[0] == b"ISSUED")
            used = cpu_seconds(pid) - before
            await caught_up(master, replica)
            replica_used = cpu_seconds(replica_pid) - replica_before
        finally:
            await master.aclose()
            await replica.aclose()
    finally:
        await event_state.delete_state(client, event_id)
    if issued != issues:
        raise RuntimeError(f"variant {variant.name}: {issued} of {issues} presses issued")
    return Cost(used / issues * 1e6, replica_used / issues * 1e6)


def summary(costs: dict[str, list[Cost]]) -> dict[str, dict[str, Any]]:
    """Per variant: the master's median µs per issue, each repeat's, the median against
    as-is's; the replica's median and repeats beside them."""
    base = statistics.median(c.master_us for c in costs["as-is"])
    out: dict[str, dict[str, Any]] = {}
    for name, values in costs.items():
        median = statistics.median(c.master_us for c in values)
        out[name] = {
            "cpu_us_per_issue": round(median, 2),
            "repeats": [round(c.master_us, 2) for c in values],
            "ratio_vs_as_is": round(median / base, 3) if base > 0 else None,
            "saves_us": round(base - median, 2),
            "replica_cpu_us_per_issue": round(statistics.median(c.replica_us for c in values), 2),
            "replica_repeats": [round(c.replica_us, 2) for c in values],
        }
    return out


def table_lines(summarised: dict[str, dict[str, Any]]) -> list[str]:
    head = f"{'variant':14s} {'us/issue':>9s} {'vs as-is':>9s} {'saves us':>9s} {'replica us':>10s}"
    lines = [f"{head}  repeats (master)"]
    for name, s in summarised.items():
        repeats = " ".join(f"{v:.1f}" for v in s["repeats"])
        cpu, ratio, saves = s["cpu_us_per_issue"], share_cell(s["ratio_vs_as_is"]), s["saves_us"]
        replica = s["replica_cpu_us_per_issue"]
        lines.append(f"{name:14s} {cpu:9.1f} {ratio:>9s} {saves:9.1f} {replica:10.1f}  {repeats}")
    return lines


async def run(
    settings: RedisSettings, variants: Sequence[Variant], issues: int, per_call: int, repeats: int
) -> dict[str, list[Cost]]:
    client = create_redis_cluster(settings)
    await client.initialize()
    costs: dict[str, list[Cost]] = {v.name: [] for v in variants}
    try:
        for repeat in range(1, repeats + 1):
            for variant in variants:
                cost = await cost_per_issue(client, variant, issues, per_call)
                costs[variant.name].append(cost)
                print(
                    f"repeat {repeat} {variant.name:14s} {cost.master_us:6.1f} us/issue, "
                    f"replica {cost.replica_us:6.1f}",
                    flush=True,
                )
    finally:
        await client.aclose()
    return costs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench_master")
    ap.add_argument("--issues", type=int, default=40_000, help="presses per variant and repeat")
    ap.add_argument("--per-call", type=int, default=32, help="presses per EVALSHA (the batch)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=RESULTS / "bench-master.json")
    ap.add_argument("--against", metavar="REV", help="also issue.lua as committed at REV")
    args = ap.parse_args(argv)
    if args.issues < 1 or args.per_call < 1 or args.repeats < 1:
        ap.error("--issues, --per-call and --repeats must be at least 1")
    variants: tuple[Variant, ...] = VARIANTS
    if args.against:
        try:
            variants = (*VARIANTS, revision_variant(args.against))
        except ValueError as exc:
            ap.error(str(exc))
    for variant in variants:  # a cut that no longer matches stops the run before it starts
        variant.source(ISSUE.source)
    settings = RedisSettings.from_env(stack_env())
    costs = asyncio.run(run(settings, variants, args.issues, args.per_call, args.repeats))
    summarised = summary(costs)
    report = {
        "benchmark": "master",
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg(),
        "settings": {
            "issues": args.issues,
            "per_call": args.per_call,
            "repeats": args.repeats,
            "against": args.against,
        },
        "variants": summarised,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print()
    print("\n".join(table_lines(summarised)))
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
