"""What a benchmark reads from Linux /proc: a process's CPU time and peak memory, the box's CPU.

CPU is user + system time (/proc/<pid>/stat), summed over the process and its live
descendants: granian and uvicorn --workers serve from child processes, and a parent's own
counters do not include children until they are reaped. Peak memory is VmHWM (the resident
set's high-water mark) from /proc/<pid>/status, read before the process is stopped. The box's
CPU (/proc/stat) counts what no process is charged with too: the kernel's loopback traffic,
Redis replicas, anything else running.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

MIB = 1024 * 1024


def stat_cpu_ticks(stat_line: str, *, reaped_children: bool = False) -> int:
    """utime + stime (clock ticks) from one /proc/<pid>/stat line (the name may hold ')'),
    plus cutime + cstime (children it has waited for) if asked."""
    fields = stat_line.rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    if reaped_children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks


def box_ticks(proc_stat: str) -> tuple[int, int]:
    """(busy, total) clock ticks of all cores from /proc/stat's first line. Busy is user, nice,
    system, irq and softirq (guest time is inside user); total adds idle, iowait and steal
    (time the hypervisor gave to someone else: not this box's to use)."""
    name, *fields = proc_stat.split("\n", 1)[0].split()
    if name != "cpu":
        raise ValueError(f"not /proc/stat's aggregate line: {name!r}")
    user, nice, system, idle, iowait, irq, softirq, steal = (int(f) for f in fields[:8])
    busy = user + nice + system + irq + softirq
    return busy, busy + idle + iowait + steal


BoxCpu = tuple[float, float]  # (busy, total) CPU seconds of all the box's cores


def box_cpu_seconds() -> BoxCpu:
    """(busy, total) CPU seconds of all cores so far (`box_ticks` of /proc/stat)."""
    busy, total = box_ticks(Path("/proc/stat").read_text())
    tick = os.sysconf("SC_CLK_TCK")
    return busy / tick, total / tick


def status_kib(status_text: str, field: str) -> int | None:
    """A `kB` field (VmHWM, VmRSS) of /proc/<pid>/status, in KiB; None if absent."""
    for line in status_text.splitlines():
        name, _, value = line.partition(":")
        if name == field:
            return int(value.split()[0])
    return None


def descendants(pid: int) -> list[int]:
    """`pid` and every live process below it (children lists of every thread)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo.extend(int(c) for c in (task / "children").read_text().split())
            except OSError:
                continue  # the thread or process ended meanwhile
    return found


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) `pid` and its live descendants have used so far."""
    return sum(own_cpu_seconds(p) for p in descendants(pid))


def own_cpu_seconds(pid: int, *, reaped_children: bool = False) -> float:
    """CPU time of one process (all its threads, no descendants), plus that of the children it
    has waited for if asked; 0.0 once it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    return stat_cpu_ticks(stat, reaped_children=reaped_children) / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pids: Mapping[str, int]) -> dict[str, float | None]:
    """Peak resident memory (VmHWM) per named process, MiB; None for one already gone.

    For a process with server children (granian) the largest of the tree is reported: the
    worker that serves is the one whose memory matters.
    """
    out: dict[str, float | None] = {}
    for name, pid in pids.items():
        peaks = []
        for p in descendants(pid):
            try:
                kib = status_kib(Path(f"/proc/{p}/status").read_text(), "VmHWM")
            except OSError:
                continue
            if kib is not None:
                peaks.append(kib)
        out[name] = round(max(peaks) * 1024 / MIB, 1) if peaks else None
    return out
