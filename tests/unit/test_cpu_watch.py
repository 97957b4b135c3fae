"""The demo's CPU by phase (cpu_watch): interpolation, windows, roles, and real /proc readings."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from flashcoupon_loadtest.cpu_watch import (
    BOX,
    DRIVER,
    CpuWatch,
    by_role,
    cpu_at,
    load_side_cpu_seconds,
    phase_cpu,
    role,
    stack_pids,
    window_cpu,
)
from flashcoupon_loadtest.report import phase_cpu_lines

# gateway-1 burns 0.5 core until t=12, then 1 core; redis-17001 0.25 core; the box 1.5 cores.
SAMPLES = [
    (10.0, {"gateway-1": 1.0, "redis-17001": 5.0, BOX: 100.0}),
    (12.0, {"gateway-1": 2.0, "redis-17001": 5.5, BOX: 103.0}),
    (14.0, {"gateway-1": 4.0, "redis-17001": 6.0, BOX: 106.0}),
]


def test_cpu_at_interpolates_and_clamps() -> None:
    assert cpu_at(SAMPLES, "gateway-1", 11.0) == pytest.approx(1.5)
    assert cpu_at(SAMPLES, "gateway-1", 13.5) == pytest.approx(3.5)
    assert cpu_at(SAMPLES, "gateway-1", 9.0) == 1.0  # before the first sample
    assert cpu_at(SAMPLES, "gateway-1", 20.0) == 4.0  # after the last
    assert cpu_at(SAMPLES, "never-sampled", 11.0) == 0.0
    # A process that ended reads 0 from then on: it used nothing more, never negative CPU.
    gone = [*SAMPLES, (16.0, {"gateway-1": 0.0})]
    assert cpu_at(gone, "gateway-1", 15.0) == 4.0
    assert window_cpu(gone, 14.0, 16.0, answers=1)["gateway-1"]["cpu_seconds"] == 0.0


def test_window_cpu_per_process() -> None:
    got = window_cpu(SAMPLES, 11.0, 13.0, answers=1_000)
    assert got["gateway-1"] == {"cpu_seconds": 1.5, "core_share": 0.75, "us_per_answer": 1500.0}
    assert got["redis-17001"]["core_share"] == 0.25
    assert got[BOX]["core_share"] == 1.5
    only = window_cpu(SAMPLES, 11.0, 13.0, answers=0, names={"gateway-1"})
    assert list(only) == ["gateway-1"] and only["gateway-1"]["us_per_answer"] == 0.0


def test_roles_and_what_no_process_was_charged_with() -> None:
    assert [role(n) for n in ("gateway-2", "redis-17004", "kafka-1", "mariadb", DRIVER)] == [
        "gateway",
        "redis",
        "kafka",
        "mariadb",
        "driver",
    ]
    share = {"gateway-1": 0.5, "gateway-2": 0.25, "redis-17001": 0.125, BOX: 1.0}
    cores = by_role({n: {"core_share": c} for n, c in share.items()})
    assert cores == {"gateway": 0.75, "redis": 0.125, "other": 0.125}
    assert list(cores) == ["gateway", "redis", "other"]  # largest first, the rest last


def test_phases_split_at_the_sell_out() -> None:
    answers = [10.5, 11.0, 12.0, 12.5, 13.0, 13.9]  # the last coupon's answer at 12.0
    phases = phase_cpu(SAMPLES, go=10.0, sold_out=12.0, end=14.0, answer_times=answers)
    assert phases is not None and list(phases) == ["issuing", "sold_out"]
    issuing, sold_out = phases["issuing"], phases["sold_out"]
    assert (issuing["seconds"], issuing["answers"], sold_out["answers"]) == (2.0, 3, 3)
    assert issuing["cores"]["gateway"] == 0.5 and sold_out["cores"]["gateway"] == 1.0
    assert issuing["box_cores"] == 1.5 and issuing["cores"]["other"] == 0.75
    assert issuing["processes"]["gateway-1"]["us_per_answer"] == pytest.approx(333_333.3)
    # Not sold out: the whole burst issued; one sample cannot make a window.
    whole = phase_cpu(SAMPLES, go=10.0, sold_out=None, end=14.0, answer_times=answers)
    assert whole is not None and list(whole) == ["issuing"] and whole["issuing"]["answers"] == 6
    assert phase_cpu(SAMPLES[:1], go=10.0, sold_out=None, end=14.0, answer_times=[]) is None
    lines = phase_cpu_lines(phases)
    assert lines[0].startswith("  phase CPU     issuing 2.00 s, 3 answers, 1.50 cores busy: ")
    assert "gateway 0.50, redis 0.25, other 0.75" in lines[0]
    assert lines[1].startswith(" " * 16 + "sold-out 2.00 s") and phase_cpu_lines(None) == []


def test_stack_pids_skip_stale_pidfiles(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    (pids / "redis-17001.pid").write_text(f"{os.getpid()}\n")
    (pids / "kafka-1.pid").write_text("4194999\n")  # above pid_max: never a live process
    (pids / "mariadb.pid").write_text("not a pid\n")
    assert stack_pids(tmp_path) == {"redis-17001": os.getpid()}
    assert stack_pids(tmp_path / "absent") == {}


def test_stack_pids_find_servers_reused_from_another_checkout(tmp_path: Path) -> None:
    """A clone whose `stack-up` found the servers already up records their pids apart
    (reused/): the demo's phase CPU still has its Redis, Kafka and MariaDB rows; a server this
    checkout started itself is the one counted when both are recorded."""
    (tmp_path / "pids").mkdir()
    (tmp_path / "reused").mkdir()
    (tmp_path / "reused" / "mariadb.pid").write_text(f"{os.getppid()}\n")
    (tmp_path / "reused" / "redis-17001.pid").write_text(f"{os.getppid()}\n")
    (tmp_path / "pids" / "redis-17001.pid").write_text(f"{os.getpid()}\n")
    (tmp_path / "reused" / "kafka-1.pid").write_text("4194999\n")  # gone since
    assert stack_pids(tmp_path) == {"mariadb": os.getppid(), "redis-17001": os.getpid()}


def test_watch_reads_real_processes_and_keeps_services_out_of_the_driver() -> None:
    # The service burns on past the 0.35 s the checks need: the second load-side reading
    # below also counts this process's own CPU for the first (a /proc walk, long on a busy box
    # with a build's hundreds of processes), which a burn ending at 0.4 s did not cover.
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.5: pass\n"
    service = subprocess.Popen([sys.executable, "-c", burn + "time.sleep(30)"])
    try:
        watch = CpuWatch({"gateway-1": service.pid}, {"me": os.getpid()}, interval=0.05).start()
        deadline = time.monotonic() + 20
        while watch.samples[-1][1]["gateway-1"] < 0.35 and time.monotonic() < deadline:
            time.sleep(0.05)
        samples = watch.stop()
        last = samples[-1][1]
        assert set(last) == {"gateway-1", "me", DRIVER, BOX}
        assert last["gateway-1"] >= 0.35  # the service's burn is its own, not the driver's:
        assert load_side_cpu_seconds([]) - load_side_cpu_seconds([service.pid]) >= 0.35
        assert len(samples) >= 3 and samples[-1][0] > samples[0][0]
    finally:
        service.kill()
        service.wait()
