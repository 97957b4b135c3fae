"""`make chaos-k8s`'s pure pieces: which shim to kill, and a row's figures from a demo report."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from flashcoupon_loadtest.chaos.cluster import start_at_of
from flashcoupon_loadtest.chaos.k8s import (
    ROWS,
    SHIM,
    Proc,
    fault_window,
    figures,
    format_table,
    select_shim,
)

SOCK = "/work/x/.stack/k8s/containerd/containerd.sock"
SHIM_PATH = f"/usr/bin/{SHIM}"


def shim(pid: int, sandbox: str, address: str = SOCK) -> Proc:
    return Proc(pid, 1, (SHIM_PATH, "-namespace", "k8s.io", "-id", sandbox, "-address", address))


PROCS = [
    Proc(1, 0, ("/sbin/init",)),
    shim(100, "sandbox-a"),
    shim(200, "sandbox-b"),
    shim(300, "sandbox-a", address="/other/containerd.sock"),  # another cluster's containerd
    Proc(101, 100, ("/pause",)),
    Proc(102, 100, ("python", "-m", "flashcoupon_issuer")),
    Proc(201, 200, ("/pause",)),
]


def test_the_shim_whose_id_is_the_pods_sandbox_on_our_containerd() -> None:
    assert select_shim(PROCS, {"sandbox-a", "container-x"}, SOCK).pid == 100


def test_without_an_id_match_the_shim_is_the_task_processes_parent() -> None:
    assert select_shim(PROCS, {"unknown"}, SOCK, task_pid=201).pid == 200


def test_no_shim_of_our_containerd_is_an_error() -> None:
    with pytest.raises(LookupError):
        select_shim(PROCS, {"sandbox-a"}, "/nowhere.sock", task_pid=102)
    with pytest.raises(LookupError):
        select_shim([*PROCS, shim(400, "sandbox-a")], {"sandbox-a"}, SOCK)


def test_start_at_is_read_from_the_demos_apply_line() -> None:
    line = "kubectl apply: CouponEvent k8s-1, 2,000 coupons, startAt 02:30:15.250 UTC\n"
    today = datetime(2026, 11, 24, 1, 0, tzinfo=UTC)
    assert start_at_of(line, today) == datetime(2026, 11, 24, 2, 30, 15, 250000, UTC).timestamp()
    assert start_at_of("burst: 20,000 shoppers", today) is None


def bucket(t: float, p99: float, errors: int = 0, answers: int = 10) -> dict[str, float]:
    return {"t": t, "answers": answers, "p50_ms": p99 / 2, "p99_ms": p99, "errors": errors}


def test_fault_window_takes_the_worst_bucket_and_the_last_bad_one_after_the_end() -> None:
    series = [bucket(1.0, 50), bucket(2.0, 400), bucket(3.0, 1500), bucket(4.5, 60, errors=2),
              bucket(9.0, 40), bucket(12.0, 30)]  # fmt: skip
    p50, p99, recovery = fault_window(series, 1000.0, start=1001.5, end=1001.5)
    assert p99 == 1500 and p50 == 200  # buckets 2.0-4.5 (the 5 s after an instant fault)
    assert recovery == 3.0  # the error bucket at t0 + 4.5


def report(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "coupons": 100,
        "redis_issued": 100,
        "persisted": 100,
        "drain_seconds": 0.0,
        "t0": 1000.0,
        "statuses": {"201": 100, "410": 900, "503": 3},
        "summary": {"requests": 1003, "issued_answers": 100, "retry_contradictions": 0},
        "invariants": [{"invariant": i, "verdict": "PASS", "detail": ""} for i in range(1, 7)],
        "series": [bucket(1.0, 50), bucket(2.0, 80)],
    }
    return {**base, **over}


def test_a_clean_burst_passes_with_503s_allowed() -> None:
    f = figures(report(), fault=(1001.0, 1001.0), replaced_s=4.0)
    assert f.failures() == [] and f.lost == f.duplicated == f.oversold == f.wrong_total == 0


def test_lost_oversold_and_other_5xx_fail_the_row() -> None:
    invariants = report()["invariants"]
    invariants[4] = {"invariant": 5, "verdict": "FAIL", "detail": "100 coupons answered 201, "
                     "2 without their row"}  # fmt: skip
    r = report(redis_issued=103, persisted=101, invariants=invariants,
               statuses={"201": 100, "500": 4, "404": 1})  # fmt: skip
    f = figures(r, fault=(1001.0, 1001.0), replaced_s=None)
    assert (f.lost, f.oversold) == (2 + 2, 3)
    assert f.wrong == {"other_5xx": 4, "unexpected_status": 1}
    assert f.failures() == ["lost", "oversold", "wrong", "invariant 5"]


def test_every_row_has_a_kind_the_runner_fires_and_the_table_prints_each() -> None:
    assert {r.kind for r in ROWS.values()} <= {"delete", "shim", "helm"}
    f = figures(report(), fault=(1001.0, 1001.0), replaced_s=4.0)
    table = format_table([(name, f, "PASS") for name in ROWS] + [("x", None, "FAIL")], [])
    assert all(name in table for name in ROWS)
