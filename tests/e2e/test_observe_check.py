"""`make observe-check` as part of the suite: a private Prometheus scrapes a local run of every
service through a short burst, and every dashboard panel query and every rule is evaluated.

Each query returns data, or the allow-list in flashcoupon_loadtest.observe says why it cannot;
no metric a dashboard or rule names is missing from the scrape; every rule evaluates healthy.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flashcoupon_loadtest import observe


def test_every_dashboard_query_and_rule_returns_data_on_a_real_prometheus(
    stack: Any, tmp_path: Path
) -> None:
    png = tmp_path / "dashboard.png"
    report = observe.run_check(users=2000, coupons=200, workdir=tmp_path / "observe", png=png)
    (tmp_path / "observe-check.json").write_text(json.dumps(report.to_json(), indent=2))
    table = report.table()
    assert report.failures == [], table

    keys = [o.query.key for o in report.outcomes]
    expected = [q.key for q in (*observe.dashboard_queries(), *observe.rule_queries())]
    assert keys == expected and len(keys) == len(set(keys)), "every query evaluated once"
    assert set(observe.ALLOWED) <= set(keys), "an allow-list entry names no query"
    rules = {q.key.split("/", 1)[1] for q in observe.rule_queries()}
    assert rules <= set(report.rules), "Prometheus loaded every rule of the file"
    assert report.seconds < 180, table  # ~25 s on an idle machine, 45-100 s under shared load
    assert png.stat().st_size > 20_000  # the drop overview drawn from the run's range queries
