"""A small `make demo`: 5,000 shoppers at 500 coupons through the real services as processes.

Runs the demo exactly as a user does (`python -m flashcoupon_loadtest.demo`), against a fresh
MySQL database, its own Kafka topic and a unique event, and asserts what the demo reports:
every invariant PASS, checked by the demo against Redis and MySQL directly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

USERS, COUPONS = 5_000, 500


def test_small_demo_passes_every_invariant(stack: Any, mysql_url: str, tmp_path: Path) -> None:
    cmd = [
        sys.executable, "-m", "flashcoupon_loadtest.demo",
        "--users", str(USERS), "--coupons", str(COUPONS), "--concurrency", "64",
        "--mysql-url", mysql_url, "--results-dir", str(tmp_path), "--cleanup",
        "--drain-timeout", "90",
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=stack.env(), capture_output=True, text=True, timeout=270)
    output = proc.stdout + proc.stderr
    report_path = tmp_path / "demo.json"
    assert report_path.exists(), output
    report = json.loads(report_path.read_text())
    verdicts = {c["invariant"]: c["verdict"] for c in report["invariants"]}
    assert verdicts == {1: "PASS", 2: "PASS", 3: "PASS", 4: "PASS", 5: "PASS", 6: "PASS"}, output
    assert proc.returncode == 0, output

    summary = report["summary"]
    first = summary["outcomes_by_kind"]["first"]
    assert first.get("ISSUED") == COUPONS, first  # demand exceeded supply: sold out exactly
    assert sum(first.values()) == USERS
    assert report["redis_issued"] == report["persisted"] == COUPONS
    assert summary["retry_contradictions"] == 0
    dups = summary["outcomes_by_kind"].get("dup", {})
    assert "ISSUED" not in dups, dups  # perUserLimit 1: another press never gets a 2nd coupon
    assert (tmp_path / "demo.png").stat().st_size > 10_000
    assert "RESULT: PASS" in proc.stdout

    # The same-run hello-world baseline and every started process's peak memory are reported.
    baseline = report["baseline"]
    assert baseline["hello"]["outcomes"] == {"HTTP_200": baseline["hello"]["requests"]}, baseline
    assert baseline["ratio"] == round(summary["throughput_rps"] / baseline["hello_rps"], 3)
    assert "of hello-world" in proc.stdout
    peaks = report["peak_rss_mib"]
    names = {"gateway-1", "gateway-2", "issuer-1", "issuer-2", "relay-1", "persister-1", "wallet"}
    assert set(peaks) == names and all(mib > 10 for mib in peaks.values()), peaks
    assert set(report["burst_cpu"]) == names, report["burst_cpu"]
    assert all(c["cpu_seconds"] > 0 for n, c in report["burst_cpu"].items() if "gateway" in n)
    # Each phase's CPU: the services, the stack's servers, the driver, what the box was busy.
    phases = report["phase_cpu"]
    assert list(phases) == ["issuing", "sold_out"], phases
    roles = {"gateway", "issuer", "relay", "persister", "redis", "kafka", "mariadb", "driver"}
    assert roles <= set(phases["issuing"]["cores"]), phases["issuing"]["cores"]
    assert all(phases["issuing"]["cores"][r] > 0 for r in ("gateway", "issuer", "redis"))
    assert sum(p["answers"] for p in phases.values()) == summary["requests"]
    assert 0 < phases["sold_out"]["box_cores"] <= (os.cpu_count() or 1) + 0.2  # tick jitter
    assert "phase CPU     issuing" in proc.stdout
    # Each Redis server's busiest commands: the event's master ran issue.lua (EVALSHA) and
    # its outbox entries (XADD inside the script), one call per coupon at most.
    servers = report["redis_calls"]
    masters = [s["commands"] for s in servers.values() if s["role"] == "master"]
    assert any("evalsha" in c for c in masters), servers
    assert any(0 < c.get("evalsha", {}).get("calls", 0) <= COUPONS * 2 for c in masters), servers
    assert "redis calls   " in proc.stdout
