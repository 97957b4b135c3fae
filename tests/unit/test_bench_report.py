"""The measuring side's arithmetic: the demo's hello-world baseline, peak memory, /proc parsing."""

from __future__ import annotations

import os

import pytest
from flashcoupon_loadtest.demo_report import BASELINE_TARGET, baseline
from flashcoupon_loadtest.driver import firing_window
from flashcoupon_loadtest.procstat import (
    box_cpu_seconds,
    box_ticks,
    cpu_seconds,
    peak_rss_mib,
    stat_cpu_ticks,
    status_kib,
)
from flashcoupon_loadtest.report import baseline_lines, cpu_lines

HELLO = {"rps": 20_000.0, "p99_ms": 9.5, "requests": 30_000}


def test_baseline_ratio_and_target() -> None:
    b = baseline(8_000.0, HELLO)
    assert b is not None
    assert (b["ratio"], b["met"], b["target"]) == (0.4, True, BASELINE_TARGET)
    below = baseline(3_000.0, HELLO)
    assert below is not None and below["ratio"] == 0.15 and not below["met"]


def test_baseline_absent_or_zero() -> None:
    assert baseline(1.0, None) is None
    b = baseline(1.0, {**HELLO, "rps": 0.0})
    assert b is not None and b["ratio"] is None and not b["met"]


def test_baseline_line_reads_as_the_issue_asks() -> None:
    (line,) = baseline_lines(baseline(3_000.0, HELLO), None)
    assert "answers/s 3,000 = 0.15 of hello-world 20,000 (same driver, same run" in line
    assert "NOT met" in line and "p99 9.5 ms" in line


def test_peak_rss_line_names_every_process() -> None:
    lines = baseline_lines(None, {"gateway-1": 81.25, "relay-1": None})
    assert lines == ["  peak RSS      gateway-1 81.2, relay-1 n/a MiB (VmHWM per process)"]
    assert baseline_lines(None, None) == []


def test_proc_parsing() -> None:
    # The command name may hold spaces and ')': fields count from the last ')'.
    line = "42 (a) b) S 1 42 42 0 -1 4194560 100 0 0 0 250 75 3 4 20 0 1 0 9 0 0"
    assert stat_cpu_ticks(line) == 325
    assert stat_cpu_ticks(line, reaped_children=True) == 325 + 3 + 4
    status = "Name:\tpython\nVmPeak:\t  300000 kB\nVmHWM:\t   81920 kB\nVmRSS:\t 40000 kB\n"
    assert status_kib(status, "VmHWM") == 81920
    assert status_kib(status, "VmSwap") is None


def test_box_cpu_parsing() -> None:
    # user nice system idle iowait irq softirq steal guest guest_nice: guest is inside user,
    # steal is the hypervisor's (counted in the total, never as this box's busy time).
    text = "cpu  700 10 200 1000 40 5 45 100 30 0\ncpu0 350 5 100 500 20 2 23 50 15 0\n"
    assert box_ticks(text) == (960, 2100)
    with pytest.raises(ValueError):
        box_ticks("cpu0 1 2 3 4 5 6 7 8\n")


def test_the_firing_window_spans_every_worker() -> None:
    # Two workers read the box at their own start and end: the window runs from the earlier
    # start to the later end, whichever worker read them.
    w0 = ((100.0, 400.0), (103.0, 406.0))
    w1 = ((100.5, 401.0), (104.0, 408.0))
    assert firing_window([w0, w1]) == (4.0, 8.0)
    assert firing_window([w1, w0]) == (4.0, 8.0)
    assert firing_window([]) is None


def test_this_process_is_readable() -> None:
    # /proc is the real one (Linux): our own figures are positive; a gone pid reads None.
    assert cpu_seconds(os.getpid()) > 0
    busy, total = box_cpu_seconds()
    assert 0 < busy < total
    peaks = peak_rss_mib({"me": os.getpid(), "gone": 2**22 + 1})
    assert peaks["me"] is not None and peaks["me"] > 10
    assert peaks["gone"] is None


def test_burst_cpu_line() -> None:
    got = {
        "gateway-1": {"cpu_seconds": 2.0, "core_share": 0.5, "us_per_answer": 200.0},
        "issuer-1": {"cpu_seconds": 0.5, "core_share": 0.125, "us_per_answer": 50.0},
    }
    assert cpu_lines(got) == [
        "  burst CPU     gateway-1 2.0 s (50% of a core, 200 us/answer), "
        "issuer-1 0.5 s (12% of a core, 50 us/answer)"
    ]
    assert cpu_lines(None) == []
