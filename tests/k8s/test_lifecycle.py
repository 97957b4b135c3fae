"""A CouponEvent's whole life on the cluster, from the in-cluster operator's own status writes.

Runs `make k8s-demo` small (k8s/dev/demo.py): `kubectl apply`, phases Pending → Ready → Active
at startAt → SoldOut with Persisted = quantity, a burst through the gateway's NodePort with
every invariant PASS, then `kubectl delete` running the finalizer (Redis keys gone, MySQL rows
kept). The demo itself checks all of that and exits 1 on any failure.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.k8s import Release
from tests.support.paths import ROOT


def test_demo_lifecycle_on_the_cluster(release: Release, tmp_path: Path) -> None:
    # Its own results directory: the committed loadtest/results/k8s is `make k8s-demo`'s.
    cmd = [sys.executable, str(ROOT / "k8s/dev/demo.py"), "--users", "5000", "--coupons", "500",
           "--concurrency", "64", "--drain-timeout", "90",
           "--results-dir", str(tmp_path)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-6000:]
    assert "k8s demo: PASS" in proc.stdout, output[-6000:]
    phases = json.loads((tmp_path / "phases.json").read_text())
    seen = [t["phase"] for t in phases["transitions"] if t["phase"] != "<none>"]
    # Active must show even though 500 coupons sell out within one operator refresh: the
    # timer wakes at startAt (reconcile.seconds_to_opening). Preloading may sit between.
    lifecycle = ["Pending", "Ready", "Active", "SoldOut"]
    assert [p for p in seen if p in lifecycle] == lifecycle, seen
    report = json.loads((tmp_path / "demo.json").read_text())
    assert report["passed"], report["invariants"]
    assert report["redis_issued"] == report["persisted"] == 500
