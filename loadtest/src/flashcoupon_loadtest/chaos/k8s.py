"""`make chaos-k8s`'s rows and their figures: pure functions over the demo's report.

Each row is a burst through the dev release's gateway NodePort (k8s/dev/demo.py, via
chaos/cluster.py's `burst_with`) with one pod-level fault fired mid-burst (chaos/k8s_run.py
fires it). Its figures come from the demo's report: answers by HTTP status, the 0.1 s latency
series, Redis issued and MySQL rows after the drain, and the invariant checks — the same
categories as `make chaos` (chaos/checker.py): anything lost, duplicated, oversold or wrongly
answered fails the row; latency and recovery are reported, not asserted.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from flashcoupon_loadtest.chaos.checker import EXPECTED, INSTANT_WINDOW, SLOW, percentile
from flashcoupon_loadtest.chaos.report import number_cell, table_lines

SHIM = "containerd-shim-runc-v2"


@dataclass(frozen=True)
class K8sRow:
    name: str
    what: str
    component: str  # the Deployment whose pod the fault hits
    kind: str  # delete | shim | helm
    at: float = 2.0  # seconds after startAt
    users: int = 30_000
    coupons: int = 3_000
    spread: float = 12.0  # seconds over which first presses are spread


def _delete(component: str) -> K8sRow:
    return K8sRow(
        f"pod-{component}-delete",
        f"kubectl delete pod --force --grace-period=0 (one {component} pod)",
        component,
        "delete",
    )


ROWS: dict[str, K8sRow] = {
    r.name: r
    for r in (
        *(_delete(c) for c in ("gateway", "issuer", "relay", "persister")),
        K8sRow("shim-issuer-kill", f"kill -9 the issuer pod's {SHIM}", "issuer", "shim"),
        K8sRow(
            "helm-upgrade",
            "helm upgrade: the issuers' image tag changes (rolling)",
            "issuer",
            "helm",
            at=1.0,
            spread=15.0,
        ),
    )
}


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    argv: tuple[str, ...]


def _flag(argv: Sequence[str], name: str) -> str | None:
    for i, arg in enumerate(argv[:-1]):
        if arg == name:
            return argv[i + 1]
    return None


def select_shim(
    procs: Iterable[Proc], ids: Iterable[str], address: str, task_pid: int | None = None
) -> Proc:
    """The containerd-shim serving a pod: its `-id` is the pod's sandbox (or container) id.

    Only shims of the cluster's own containerd (`-address` = its socket) are candidates; when
    no `-id` matches, the shim is the nearest shim ancestor of the container's task process.
    """
    procs = list(procs)
    wanted = set(ids)
    shims = [
        p
        for p in procs
        if p.argv and p.argv[0].rsplit("/", 1)[-1] == SHIM and _flag(p.argv, "-address") == address
    ]
    matched = [p for p in shims if _flag(p.argv, "-id") in wanted]
    if len(matched) == 1:
        return matched[0]
    if len(matched) > 1:
        raise LookupError(f"{len(matched)} shims match {sorted(wanted)}")
    by_pid = {p.pid: p for p in procs}
    shim_pids = {p.pid for p in shims}
    pid = by_pid[task_pid].ppid if task_pid in by_pid else None
    while pid is not None and pid in by_pid:
        if pid in shim_pids:
            return by_pid[pid]
        pid = by_pid[pid].ppid if by_pid[pid].ppid != pid else None
    raise LookupError(f"no {SHIM} on {address} for {sorted(wanted)} (task pid {task_pid})")


@dataclass
class K8sFigures:
    requests: int
    statuses: dict[str, int]
    acknowledged: int
    redis_issued: int
    mysql_rows: int
    lost: int
    duplicated: int
    oversold: int
    wrong: dict[str, int]
    p50_fault_ms: float | None
    p99_fault_ms: float | None
    recovery_s: float | None  # fault end → last 0.1 s bucket with an error or p99 > 1 s
    replaced_s: float | None  # fault → the Deployment's pods all Ready again
    drain_s: float | None
    invariants_failed: list[str]

    @property
    def wrong_total(self) -> int:
        return sum(self.wrong.values())

    def failures(self) -> list[str]:
        counts = {
            "lost": self.lost,
            "duplicated": self.duplicated,
            "oversold": self.oversold,
            "wrong": self.wrong_total,
        }
        failed = [c for c, n in counts.items() if n]
        return failed + [f"invariant {i}" for i in self.invariants_failed]


def _count(detail: str, pattern: str) -> int:
    found = re.search(pattern, detail)
    return int(found.group(1).replace(",", "")) if found else 1


def _invariant(report: dict[str, Any], number: int) -> dict[str, Any]:
    return next((c for c in report["invariants"] if c["invariant"] == number), {})


def fault_window(
    series: Sequence[dict[str, float]], t0: float, start: float, end: float
) -> tuple[float | None, float | None, float | None]:
    """(p50, p99, recovery) from the demo's 0.1 s buckets (t: bucket end after t0).

    p50 is the answers-weighted median of the buckets' p50s and p99 the worst bucket's, over
    the fault and (an instant fault) the 5 s after it, as in `make chaos`. Recovery: seconds
    from the fault's end to the last bucket holding an error (no answer, 5xx) or p99 > 1 s.
    """
    window = max(end, start + INSTANT_WINDOW)
    during = [b for b in series if b["answers"] and start <= t0 + b["t"] <= window + 0.1]
    p50s: list[float] = []
    for b in during:
        p50s += [b["p50_ms"]] * int(b["answers"])
    p50 = percentile(p50s, 0.5)
    p99 = max((b["p99_ms"] for b in during), default=None)
    bad = [
        t0 + b["t"]
        for b in series
        if t0 + b["t"] >= end and (b.get("errors") or b["p99_ms"] > SLOW * 1000)
    ]
    recovery = round(max(0.0, max(bad, default=end) - end), 1)
    return (
        None if p50 is None else round(p50, 1),
        None if p99 is None else round(p99, 1),
        recovery,
    )


def figures(
    report: dict[str, Any], *, fault: tuple[float, float], replaced_s: float | None
) -> K8sFigures:
    """One row's figures from the demo's report (demo.json) and the fault's (start, end)."""
    summary = report["summary"]
    statuses = {str(k): int(v) for k, v in report.get("statuses", {}).items()}
    quantity = int(report["coupons"])
    redis_issued, persisted = int(report["redis_issued"]), int(report["persisted"])
    failed = [str(c["invariant"]) for c in report["invariants"] if c["verdict"] != "PASS"]
    inv5 = _invariant(report, 5)
    lost = max(0, redis_issued - persisted)
    if inv5.get("verdict") not in (None, "PASS"):
        lost += _count(inv5["detail"], r"([\d,]+) without their row")
    duplicated = 0
    if _invariant(report, 2).get("verdict") not in (None, "PASS"):
        duplicated += _count(_invariant(report, 2)["detail"], r"([\d,]+) over the limit")
    if _invariant(report, 3).get("verdict") not in (None, "PASS"):
        duplicated += 1
    wrong: dict[str, int] = {}
    other_5xx = sum(n for s, n in statuses.items() if s.startswith("5") and s != "503")
    unexpected = sum(n for s, n in statuses.items() if int(s) not in EXPECTED and s[0] != "5")
    contradictions = int(summary.get("retry_contradictions", 0))
    for kind, n in (
        ("other_5xx", other_5xx),
        ("unexpected_status", unexpected),
        ("replay_contradicted", contradictions),
    ):
        if n:
            wrong[kind] = n
    p50, p99, recovery = fault_window(report["series"], float(report["t0"]), *fault)
    return K8sFigures(
        requests=int(summary["requests"]),
        statuses=dict(sorted(statuses.items())),
        acknowledged=int(summary["issued_answers"]),
        redis_issued=redis_issued,
        mysql_rows=persisted,
        lost=lost,
        duplicated=duplicated,
        oversold=max(0, redis_issued - quantity, persisted - quantity),
        wrong=wrong,
        p50_fault_ms=p50,
        p99_fault_ms=p99,
        recovery_s=recovery,
        replaced_s=replaced_s,
        drain_s=None if report.get("drain_seconds") is None else round(report["drain_seconds"], 1),
        invariants_failed=failed,
    )


COLUMNS = (
    ("row", 21),
    ("req", 6),
    ("201", 5),
    ("409", 5),
    ("410", 6),
    ("503", 5),
    ("5xx", 4),
    ("err", 4),
    ("acked", 5),
    ("mysql", 5),
    ("lost", 4),
    ("dup", 4),
    ("over", 4),
    ("wrong", 5),
    ("p50/p99 fault ms", 17),
    ("recov s", 7),
    ("ready s", 7),
    ("drain s", 7),
    ("verdict", 7),
)


def row_cells(name: str, f: K8sFigures | None, verdict: str) -> list[str]:
    if f is None:
        return [name, *["-"] * (len(COLUMNS) - 2), verdict]
    s = f.statuses
    other_5xx = sum(n for k, n in s.items() if k.startswith("5") and k != "503")
    return [
        name,
        str(f.requests),
        *(str(s.get(k, 0)) for k in ("201", "409", "410", "503")),
        str(other_5xx),
        str(s.get("0", 0)),
        str(f.acknowledged),
        str(f.mysql_rows),
        str(f.lost),
        str(f.duplicated),
        str(f.oversold),
        str(f.wrong_total),
        f"{number_cell(f.p50_fault_ms)}/{number_cell(f.p99_fault_ms)}",
        number_cell(f.recovery_s),
        number_cell(f.replaced_s),
        number_cell(f.drain_s),
        verdict,
    ]


def format_table(rows: Sequence[tuple[str, K8sFigures | None, str]], notes: Sequence[str]) -> str:
    lines = table_lines(COLUMNS, (row_cells(*row) for row in rows))
    legend = (
        "req: requests (first presses, second presses, replays); err: no HTTP answer; acked: "
        "coupons answered 201; mysql: rows after the drain; p50/p99 over the 0.1 s buckets "
        "answered during the fault and the 5 s after it (p99: the worst bucket); recov: fault "
        "end → last bucket with an error or p99 > 1 s; ready: fault → the Deployment all Ready "
        "again; drain: last answer → MySQL = Redis."
    )
    return "\n".join([*lines, *(f"  {n}" for n in notes), legend])
