"""The driver's self-test runs end to end: a hello-world server as a process, both clients."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_selftest_drives_hello_world_without_errors(tmp_path: Path) -> None:
    out = tmp_path / "selftest.json"
    cmd = [
        sys.executable,
        "-m",
        "flashcoupon_loadtest.driver",
        "--selftest",
        "--requests",
        "4000",
        "--concurrency",
        "16",
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = json.loads(out.read_text())["results"]
    for name in ("raw_1proc", "raw_2proc"):
        assert results[name]["requests"] == 4000
        assert results[name]["errors"] == 0
        assert results[name]["driver_cpu_s"] > 0
    assert results["httpx_1proc"]["requests"] == 1000
    assert "req per CPU-s" in proc.stdout
