"""The chaos table (terminal) and loadtest/results/chaos.json."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from flashcoupon_loadtest.chaos.runner import RowResult

COLUMNS = (
    ("row", 26),
    ("dur", 7),
    ("req", 6),
    ("201", 5),
    ("409", 5),
    ("410", 5),
    ("503", 5),
    ("5xx", 4),
    ("err", 4),
    ("acked", 5),
    ("mysql", 5),
    ("lost", 4),
    ("dup", 4),
    ("over", 4),
    ("mism", 4),
    ("wrong", 5),
    ("p50/p99 fault ms", 17),
    ("recov s", 7),
    ("catchup", 7),
    ("drain s", 7),
    ("verdict", 7),
)


def number_cell(value: float | None) -> str:
    return "-" if value is None else f"{value:g}"


def table_lines(columns: Sequence[tuple[str, int]], rows: Iterable[Sequence[str]]) -> list[str]:
    """A header, a rule and one left-aligned line per row of cells (`make chaos`, chaos-k8s)."""
    header = " ".join(name.ljust(width) for name, width in columns)
    body = [
        " ".join(c.ljust(w) for c, (_, w) in zip(cells, columns, strict=True)) for cells in rows
    ]
    return [header, "-" * len(header), *body]


def row_cells(r: RowResult) -> list[str]:
    f = r.figures
    if f is None:
        return [r.fault.name, r.fault.durability, *["-"] * (len(COLUMNS) - 3), r.verdict]
    s = f.statuses
    other_5xx = sum(n for k, n in s.items() if k.startswith("5") and k != "503")
    return [
        r.fault.name,
        r.fault.durability,
        str(f.requests),
        str(s.get("201", 0)),
        str(s.get("409", 0)),
        str(s.get("410", 0)),
        str(s.get("503", 0)),
        str(other_5xx),
        str(s.get("0", 0)),
        str(f.acknowledged),
        str(f.mysql_rows),
        str(f.lost),
        str(f.duplicated),
        str(f.oversold),
        str(f.mismatch),
        str(f.wrong_total),
        f"{number_cell(f.p50_fault_ms)}/{number_cell(f.p99_fault_ms)}",
        number_cell(f.recovery_s),
        number_cell(f.caught_up_s),
        number_cell(r.drain_s),
        r.verdict,
    ]


def format_table(rows: Sequence[RowResult]) -> str:
    lines = table_lines(COLUMNS, (row_cells(r) for r in rows))
    notes = []
    for r in rows:
        if r.error and r.verdict == "SKIP":
            notes.append(f"  {r.fault.name}: {r.error}")
        elif r.error:
            notes.append(f"  {r.fault.name}: ERROR {r.error} (logs {r.logs})")
        if r.figures is None:
            continue
        if r.figures.wrong:
            notes.append(f"  {r.fault.name}: wrong answers {r.figures.wrong}")
        if r.failures or r.verdict == "PASS*":
            what = ", ".join(r.failures) or f"only allowed: {', '.join(r.fault.allowed)}"
            notes.append(f"  {r.fault.name}: {r.verdict} ({what}); logs {r.logs}")
            for kind, examples in r.figures.examples.items():
                notes += [f"      {kind}: {e}" for e in examples[:3]]
    legend = (
        "req: requests (burst + retries of undecided shoppers); err: no HTTP answer; "
        "acked: coupons answered 201; mysql: rows after the drain; mism: MySQL rows Redis "
        "forgot; p50/p99 of burst requests sent during the fault; recov: fault end → last "
        "abnormal answer (5xx/none/429 or > 1 s); catchup: fault end → MySQL within 1 s of "
        "Redis; drain: last answer → MySQL = Redis. PASS*: only categories the setting "
        "documents as possible."
    )
    return "\n".join([*lines, *notes, legend])


def write_json(path: Path, rows: Sequence[RowResult], meta: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {**meta, "passed": all(r.verdict != "FAIL" for r in rows)}
    doc["rows"] = [r.to_json() for r in rows]
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
