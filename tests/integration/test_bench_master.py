"""`make bench-master` against the real Redis Cluster: every variant of issue.lua loads, runs and
issues every press on the event's master (a cut that broke the script fails the run)."""

from __future__ import annotations

import json
from pathlib import Path

from flashcoupon_loadtest.bench_master import VARIANTS, main

from tests.support.stack import Stack


def test_every_variant_runs_on_the_events_master(stack: Stack, tmp_path: Path) -> None:
    out = tmp_path / "bench-master.json"
    args = ["--issues", "96", "--per-call", "32", "--repeats", "1", "--against", "HEAD"]
    assert main([*args, "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["settings"] == {"issues": 96, "per_call": 32, "repeats": 1, "against": "HEAD"}
    assert list(report["variants"]) == [*(v.name for v in VARIANTS), "at HEAD"]
    for figures in report["variants"].values():
        assert len(figures["repeats"]) == 1 and figures["cpu_us_per_issue"] >= 0
        assert len(figures["replica_repeats"]) == 1 and figures["replica_cpu_us_per_issue"] >= 0
