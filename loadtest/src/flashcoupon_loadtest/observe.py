"""`make observe-check`: every dashboard query and every rule, evaluated on a real Prometheus.

    uv run python -m flashcoupon_loadtest.observe [--users 3000] [--coupons 300]

Grafana cannot run here, so the dashboards are proven the other way round: a private
Prometheus (Debian `prometheus`, installed with apt-get when missing; own port, own config and
data under .stack/observe/) scrapes every service of a local run (LocalServices: two gateways,
two issuers, relay, persister, wallet) and loads charts/flashcoupon/rules/. A short burst goes
through the gateways; once the pipeline drained, every panel query of every dashboard
(variables substituted) and every recording and alerting rule is evaluated through the HTTP
API at that moment. Each must return data, unless ALLOWED says why it legitimately cannot
(an empty DLQ, the operator needing a Kubernetes API server); and every metric a dashboard or
rule names must be in the scrape, unless ABSENT says why. Alerts compare one series with a
number (see the rules file), so their measured series is evaluated and reported too.

The Prometheus process is flashcoupon_loadtest.prometheus; the queries, and judging their
answers, flashcoupon_loadtest.queries; this module is the run that connects them.

The subtle part is time: queries are evaluated at `at`, the moment the pipeline drained while
every service was still up, so stopping the services (their series go stale) changes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from flashcoupon_loadtest.localrun import ROOT, LocalServices, stack_env
from flashcoupon_loadtest.prometheus import (
    NAMESPACE,
    STATE,
    Prometheus,
    ensure_prometheus,
    targets_of,
)
from flashcoupon_loadtest.queries import (
    DASHBOARDS,
    Outcome,
    alert_states,
    dashboard_queries,
    evaluate,
    metric_names_in,
    rule_queries,
    scraped_as,
    substitute,
)

RESULTS = ROOT / "loadtest" / "results"

_OPERATOR = (
    "the operator needs a Kubernetes API server and the local run has none; its metrics are "
    "covered by tests/unit/test_operator_metrics.py and the promtool rule tests"
)
# Queries that may legitimately return nothing in the check's run, with why.
ALLOWED: dict[str, str] = {
    "flashcoupon-drop/Sent to the waiting room / s/A": "the burst's event has no waiting room",
    "flashcoupon-red/Refused by the HTTP server / s/A": "no malformed or slow request is sent",
    "flashcoupon-red/Kafka send failures / s/A": "Kafka acks every record (a series per error)",
    "flashcoupon-red/Reconciles / s by handler and result/A": _OPERATOR,
    "flashcoupon-red/Seconds since the last successful reconcile/A": _OPERATOR,
    "flashcoupon-pipeline/Redis ↔ MySQL drift/A": _OPERATOR,
    "rule/flashcoupon:event_drift": _OPERATOR,
    "rule/flashcoupon:event_drift:settled": _OPERATOR,
    "rule/flashcoupon:operator_reconcile_errors:ratio_rate10m": _OPERATOR,
    "alert/FlashcouponRedisMysqlDrift": _OPERATOR,
    "alert/FlashcouponEventStuckPreloading": _OPERATOR,
    "alert/FlashcouponOperatorNotReconciling": _OPERATOR,
}
# Metrics a dashboard or rule names that the local run's scrape legitimately lacks. A labelled
# counter exists only after its first increment.
ABSENT: dict[str, str] = {
    "flashcoupon_gateway_queued_total": ALLOWED["flashcoupon-drop/Sent to the waiting room / s/A"],
    "flashcoupon_http_rejected_total": ALLOWED["flashcoupon-red/Refused by the HTTP server / s/A"],
    "flashcoupon_relay_send_failures_total": ALLOWED["flashcoupon-red/Kafka send failures / s/A"],
    "flashcoupon_operator_reconciles_total": _OPERATOR,
    "flashcoupon_operator_last_success_timestamp_seconds": _OPERATOR,
    "flashcoupon_operator_event_phase": _OPERATOR,
    "flashcoupon_operator_event_issued": _OPERATOR,
    "flashcoupon_operator_event_persisted": _OPERATOR,
}
# ---------------------------------------------------------------- the local run


@dataclass
class CheckReport:
    outcomes: list[Outcome]
    rules: dict[str, dict[str, Any]]
    missing: dict[str, str]  # metric -> reason ("" when not allowed)
    seconds: float
    event_id: str
    at: float

    @property
    def failures(self) -> list[str]:
        bad = [f"{o.query.key}: no data ({o.query.expr})" for o in self.outcomes if not o.ok]
        bad += [f"metric {m} missing from the scrape" for m, why in self.missing.items() if not why]
        bad += [
            f"rule {name}: health {r['health']} {r.get('lastError') or ''}"
            for name, r in self.rules.items()
            if r["health"] != "ok"
        ]
        return bad

    def to_json(self) -> dict[str, Any]:
        return {
            "event_id": self.event_id,
            "evaluated_at": datetime.fromtimestamp(self.at, UTC).isoformat(),
            "seconds": round(self.seconds, 1),
            "queries": [o.to_json() for o in self.outcomes],
            "rules": self.rules,
            "missing_metrics": self.missing,
            "failures": self.failures,
        }

    def table(self) -> str:
        lines = [f"{'query':<70} {'series':>6}  value / reason"]
        for o in self.outcomes:
            state = self.rules.get(o.query.key.split("/", 1)[1], {}).get("state", "")
            extra = f"  [{o.query.threshold}: {state}]" if o.query.threshold else ""
            value = o.sample if o.series else f"— {o.note}"
            lines.append(f"{o.query.key[:70]:<70} {o.series:>6}  {value}{extra}")
        for m, why in self.missing.items():
            lines.append(f"absent from the scrape: {m} — {why or 'NOT ALLOWED'}")
        return "\n".join(lines)


async def _drop(
    services: LocalServices, event_id: str, users: int, coupons: int, env: Mapping[str, str]
) -> None:
    """Apply a fresh event, burst it through the gateways, wait for MySQL to hold everything."""
    from flashcoupon_common.db.engine import create_engine
    from flashcoupon_common.redis_cluster import create_redis_cluster
    from flashcoupon_common.settings import MysqlSettings, RedisSettings

    from flashcoupon_loadtest import driver
    from flashcoupon_loadtest.drop import (
        DEFAULT_MANIFEST,
        PipelineWatch,
        couponctl_apply,
        demo_manifest,
    )
    from flashcoupon_loadtest.scenarios import Burst
    from flashcoupon_loadtest.tokens import DEFAULT_AUDIENCE, DEMO_SECRET

    # The relay finds the event at its next registry refresh (3 s) and starts its counters at 0;
    # the doors open after that and a scrape, so rate() sees the first batch relayed.
    start_at = datetime.now(UTC) + timedelta(seconds=7)
    doc = demo_manifest(DEFAULT_MANIFEST, name=event_id, quantity=coupons, start_at=start_at)
    await asyncio.to_thread(couponctl_apply, doc, STATE / "manifests", env)
    redis = create_redis_cluster(RedisSettings.from_env(env))
    engine = create_engine(MysqlSettings.from_env(env), pool_size=2)
    try:
        burst = Burst(
            event_id=event_id, users=users, concurrency=32, jwt_secret=DEMO_SECRET,
            jwt_audience=DEFAULT_AUDIENCE, forwarded_for=True,
        )  # fmt: skip
        await asyncio.to_thread(
            driver.run, burst, services.gateway_urls, start_at=start_at.timestamp() + 0.05
        )
        if await PipelineWatch(redis, engine, event_id).wait_drained(60) is None:
            raise RuntimeError(f"{event_id}: MySQL did not catch up with Redis within 60 s")
    finally:
        await redis.aclose()
        await engine.dispose()


async def _delete_event(event_id: str, env: Mapping[str, str]) -> None:
    from flashcoupon_common.event_state import delete_state
    from flashcoupon_common.redis_cluster import create_redis_cluster
    from flashcoupon_common.settings import RedisSettings

    redis = create_redis_cluster(RedisSettings.from_env(env))
    try:
        await delete_state(redis, event_id)
    finally:
        await redis.aclose()


def render_drop_overview(
    prom: Prometheus, out: Path, *, start: float, end: float, event_id: str, subtitle: str = ""
) -> int:
    """loadtest/results/dashboard.png: the drop overview's panels over [start, end]."""
    from flashcoupon_loadtest.dashboard_png import render

    variables = {"namespace": NAMESPACE, "event": event_id, "datasource": "prometheus"}
    scrape = float(prom.interval.rstrip("s"))
    return render(
        DASHBOARDS / "drop-overview.json",
        out,
        prom.query_range,
        start=start,
        end=end,
        substitute=lambda e: substitute(e, variables, f"{4 * scrape:g}s", f"{end - start:.0f}s"),
        subtitle=subtitle,
    )


def run_check(
    *, users: int = 3000, coupons: int = 300, workdir: Path = STATE, png: Path | None = None
) -> CheckReport:
    """The whole check: Prometheus + services + burst + evaluation. Stops what it started.

    With `png`, also draws the drop overview dashboard of the run there."""
    from flashcoupon_common.kafka_admin import create_topics, delete_topics
    from flashcoupon_common.settings import KafkaSettings

    t0 = time.monotonic()
    binary, _ = ensure_prometheus()
    workdir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **stack_env()}
    event_id = f"observe-{datetime.now(UTC).strftime('%H%M%S')}-{secrets.token_hex(3)}"
    topic = f"{event_id}-issued"
    bootstrap = KafkaSettings.from_env(env).bootstrap
    asyncio.run(create_topics(bootstrap, topic, partitions=3))
    services = LocalServices(
        relays=1,
        per_service_env={
            "relay": {"FLASHCOUPON_RELAY_EVENTS": event_id, "FLASHCOUPON_RELAY_TOPIC": topic},
            "persister": {
                "FLASHCOUPON_PERSISTER_TOPIC": topic,
                "FLASHCOUPON_PERSISTER_GROUP_ID": f"{event_id}-persister",
            },
        },
    )
    prom = Prometheus(targets_of(services), workdir=workdir)
    try:
        prom.start(binary)
        services.start()
        prom.wait_scraped(len(services.services))
        t_burst = time.time()
        asyncio.run(_drop(services, event_id, users, coupons, env))
        time.sleep(6)  # scrapes after the drain; the relay refreshes its gauges every 5 s
        at = time.time()
        variables = {"namespace": NAMESPACE, "event": event_id, "datasource": "prometheus"}
        queries = [*dashboard_queries(), *rule_queries()]
        outcomes = evaluate(prom, queries, at, variables, ALLOWED)
        rules = alert_states(prom)
        scraped = prom.metric_names()
        named = metric_names_in(q.expr for q in queries)
        missing = {m: ABSENT.get(m, "") for m in sorted(named) if not scraped_as(m, scraped)}
        if png is not None:
            title = f"observe-check, {users:,} shoppers, {coupons:,} coupons"
            render_drop_overview(
                prom, png, start=t_burst, end=at, event_id=event_id, subtitle=title
            )
        return CheckReport(outcomes, rules, missing, time.monotonic() - t0, event_id, at)
    finally:
        # The event's state stays until now: deleting it makes the services drop its series.
        asyncio.run(_delete_event(event_id, env))
        services.stop()
        prom.stop()
        asyncio.run(delete_topics(bootstrap, topic))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m flashcoupon_loadtest.observe", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    ap.add_argument("--users", type=int, default=3000)
    ap.add_argument("--coupons", type=int, default=300)
    ap.add_argument("--results-dir", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    png = args.results_dir / "observe-dashboard.png"
    report = run_check(users=args.users, coupons=args.coupons, png=png)
    print(report.table())
    args.results_dir.mkdir(parents=True, exist_ok=True)
    out = args.results_dir / "observe-check.json"
    out.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    print(f"[observe-check] {len(report.outcomes)} queries, {report.seconds:.0f}s; {out}, {png}")
    for failure in report.failures:
        print(f"FAIL {failure}")
    print("RESULT: " + ("FAIL" if report.failures else "PASS"))
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
