"""`make chaos`, short tier: a few rows with short outages and a small burst (issue 15).

Runs `python -m flashcoupon_loadtest.chaos --short` — its own private Redis Cluster, Kafka and
MariaDB on free ports, 2 gateways, 2 issuers, a relay and a persister as processes — and fails
when any row lost, duplicated or oversold a coupon, left MySQL and Redis apart, or answered a
shopper wrongly (docs/reliability.md). Rows that find a known, unfixed product bug are left
out of this tier and listed in docs/reliability.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from flashcoupon_loadtest.chaos.faults import SHORT_ROWS

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


# A deadline, not a measure: on a slow, busy 2-core box the short rows once took over 400 s
# (a clean-clone make test on 2026-11-29), where they usually take a few minutes. A row that
# stops making progress ends at its own deadline (Timing.row_budget) with its stacks printed.
@pytest.mark.timeout(920)
def test_short_chaos_rows_lose_nothing_and_answer_truthfully(tmp_path: Path) -> None:
    out = tmp_path / "chaos.json"
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "flashcoupon_loadtest.chaos", "--short", "--out", str(out)],
            capture_output=True,
            text=True,
            timeout=900,
        )
    except subprocess.TimeoutExpired as exc:  # each row has its own deadline: say where it hung
        printed = (exc.stdout or b"").decode(errors="replace")
        errors = (exc.stderr or b"").decode(errors="replace")
        pytest.fail(f"no end within 900 s:\n{printed[-4000:]}\n{errors[-8000:]}")
    print(proc.stdout[-6000:], proc.stderr[-3000:])
    assert out.exists(), f"no result written (exit {proc.returncode})"
    doc = json.loads(out.read_text())
    rows = {r["row"]: r for r in doc["rows"]}
    assert list(rows) == list(SHORT_ROWS)
    for name, row in rows.items():
        assert row["error"] is None, (name, row["error"])
        f = row["figures"]
        # The row really ran: a burst answered, coupons issued, the fault inside the burst.
        assert f["acknowledged"] > 0 and f["requests"] > f["quantity"], (name, f)
        assert row["timeline_s"]["fault_end"] < row["timeline_s"]["burst_end"], name
        assert row["verdict"] != "FAIL", (name, row["failures"], f["wrong"], f["examples"])
        assert f["mysql_rows"] == f["redis_records"] == f["issued"], (name, f)
    assert proc.returncode == 0, proc.stdout[-2000:]
