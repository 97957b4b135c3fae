"""The alerting and recording rules with Debian's promtool (installed when missing).

* `promtool check rules` on charts/flashcoupon/rules/ — the file the chart ships;
* `promtool test rules` on tests/promtool/, and every alert has a test where it fires and one
  where it stays silent;
* every alert links to a runbook under docs/runbooks/ that says what the alert means, how to
  confirm it and what to do;
* every dashboard query, variables substituted, is valid PromQL for that same promtool.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from flashcoupon_loadtest import prometheus, queries

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests" / "promtool" / "flashcoupon.rules.test.yaml"


@pytest.fixture(scope="module")
def promtool() -> str:
    return prometheus.ensure_prometheus()[1]


def alerts() -> list[dict[str, object]]:
    groups = yaml.safe_load(prometheus.RULES.read_text())["groups"]
    return [r for g in groups for r in g["rules"] if "alert" in r]


def run(promtool: str, *args: str, cwd: Path = ROOT) -> str:
    done = subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_promtool_checks_the_rules_the_chart_ships(promtool: str) -> None:
    assert "SUCCESS" in run(promtool, "check", "rules", str(prometheus.RULES))


def test_promtool_unit_tests_pass(promtool: str) -> None:
    assert "SUCCESS" in run(promtool, "test", "rules", TESTS.name, cwd=TESTS.parent)


def test_every_alert_has_a_test_that_fires_and_one_that_stays_silent() -> None:
    cases = [
        case
        for test in yaml.safe_load(TESTS.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
    ]
    for alert in alerts():
        mine = [c for c in cases if c["alertname"] == alert["alert"]]
        assert any(c["exp_alerts"] for c in mine), f"{alert['alert']} never fires in a test"
        assert any(not c["exp_alerts"] for c in mine), f"{alert['alert']} is never silent"


def test_every_alert_links_to_a_runbook_that_says_what_to_do() -> None:
    for alert in alerts():
        url = alert["annotations"]["runbook_url"]  # type: ignore[index]
        page = ROOT / url
        assert url.startswith("docs/runbooks/") and page.exists(), alert["alert"]
        text = page.read_text()
        assert f"`{alert['alert']}`" in text, f"{page.name} does not name {alert['alert']}"
        for heading in ("## What it means", "## How to confirm", "## What to do"):
            assert heading in text, f"{page.name}: {heading}"


def test_every_dashboard_query_is_valid_promql(promtool: str, tmp_path: Path) -> None:
    variables = {"namespace": "shop", "event": "bf-2026", "datasource": "prometheus"}
    rules = [
        {"record": f"dashboard:query_{i}", "expr": queries.substitute(q.expr, variables)}
        for i, q in enumerate(queries.dashboard_queries())
    ]
    path = tmp_path / "dashboards.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    assert f"SUCCESS: {len(rules)} rules found" in run(promtool, "check", "rules", str(path))
