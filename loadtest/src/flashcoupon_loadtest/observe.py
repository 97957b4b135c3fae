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

The subtle part is time: queries are evaluated at `at`, the moment the pipeline drained while
every service was still up, so stopping the services (their series go stale) changes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import IO, Any

import yaml

from flashcoupon_loadtest.localrun import ROOT, LocalServices, free_port, stack_env

RULES = ROOT / "charts" / "flashcoupon" / "rules" / "flashcoupon.rules.yaml"
DASHBOARDS = ROOT / "charts" / "flashcoupon" / "dashboards"
STATE = ROOT / ".stack" / "observe"
RESULTS = ROOT / "loadtest" / "results"
NAMESPACE = "local"  # the `namespace` target label of the local run
# What Grafana would substitute; $__rate_interval at a 1 s scrape would be 4 s: a minute keeps
# the short burst inside every window when the queries run after the drain.
RATE_INTERVAL, RANGE = "1m", "5m"

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
_METRIC = re.compile(r"\b(flashcoupon_[a-z_]*[a-z])\b")
_COMPARISON = re.compile(r"^(?P<lhs>.+?)\s*(?P<op>>=|<=|==|!=|>|<)\s*(?P<num>-?[0-9.]+)\s*$", re.S)


# ---------------------------------------------------------------- Prometheus, installed and run


def ensure_prometheus() -> tuple[str, str]:
    """Paths of `prometheus` and `promtool`; apt-get installs Debian's package when missing."""
    found = shutil.which("prometheus"), shutil.which("promtool")
    if all(found):
        return found[0] or "", found[1] or ""
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [*sudo, "apt-get", "install", "-y", "-q", "--no-install-recommends", "prometheus"]
    print("[observe] installing Debian prometheus (includes promtool) ...", flush=True)
    if subprocess.run(install, env=env, capture_output=True, check=False).returncode != 0:
        subprocess.run(
            [*sudo, "apt-get", "update", "-q"], env=env, capture_output=True, check=False
        )
        done = subprocess.run(install, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"apt-get install prometheus failed:\n{done.stderr[-2000:]}")
    prom, tool = shutil.which("prometheus"), shutil.which("promtool")
    if not (prom and tool):
        raise RuntimeError("prometheus installed but not on PATH")
    return prom, tool


@dataclass(frozen=True)
class Target:
    job: str  # e.g. flashcoupon-gateway (the rules' TargetDown matches job=~".*flashcoupon.*")
    address: str  # host:port serving /metrics


def targets_of(services: LocalServices) -> list[Target]:
    return [
        Target(f"flashcoupon-{s.name.rsplit('-', 1)[0]}", f"127.0.0.1:{s.port}")
        for s in services.services
    ]


@dataclass
class Prometheus:
    """A private Prometheus: own port, config and data dir; only 127.0.0.1 traffic."""

    targets: Sequence[Target]
    workdir: Path = STATE
    rule_files: Sequence[Path] = (RULES,)
    interval: str = "1s"
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> dict[str, Any]:
        jobs: dict[str, list[str]] = {}
        for t in self.targets:
            jobs.setdefault(t.job, []).append(t.address)
        return {
            "global": {"scrape_interval": self.interval, "evaluation_interval": self.interval},
            "rule_files": [str(p) for p in self.rule_files],
            "scrape_configs": [
                {
                    "job_name": job,
                    # As the chart's ServiceMonitor: the services' own `service` label wins.
                    "honor_labels": True,
                    "static_configs": [{"targets": addrs, "labels": {"namespace": NAMESPACE}}],
                }
                for job, addrs in jobs.items()
            ],
        }

    def start(self, binary: str, timeout: float = 30.0) -> Prometheus:
        data = self.workdir / f"data-{self.port}"
        shutil.rmtree(data, ignore_errors=True)
        data.mkdir(parents=True)
        config = self.workdir / f"prometheus-{self.port}.yml"
        config.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        self._log = open(self.workdir / f"prometheus-{self.port}.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={data}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1h",
                "--log.level=warn",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}: see {config}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"prometheus on {self.url} not ready after {timeout:.0f}s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        if self._log is not None:
            self._log.close()
            self._log = None
        shutil.rmtree(self.workdir / f"data-{self.port}", ignore_errors=True)

    def api(self, path: str, **params: str | float) -> Any:
        query = urllib.parse.urlencode({k: str(v) for k, v in params.items()})
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=30) as r:
            body = json.load(r)
        if body.get("status") != "success":
            raise RuntimeError(f"{path} {params}: {body}")
        return body["data"]

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        return list(self.api("query", query=expr, time=at)["result"])

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        return list(self.api("query_range", query=expr, start=start, end=end, step=step)["result"])

    def metric_names(self) -> set[str]:
        return set(self.api("label/__name__/values"))

    def wait_scraped(self, n: int, timeout: float = 30.0) -> None:
        """Until `n` targets are up (each has been scraped at least once)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            up = self.query("sum(up)", time.time())
            if up and float(up[0]["value"][1]) >= n:
                return
            time.sleep(0.5)
        raise TimeoutError(f"fewer than {n} targets up after {timeout:.0f}s")


# ---------------------------------------------------------------- what is evaluated


@dataclass(frozen=True)
class Query:
    key: str  # "<dashboard uid>/<panel title>/<refId>", "rule/<record>" or "alert/<name>"
    expr: str  # as written in the dashboard or rule
    threshold: str = ""  # alerts: "> 0.1" (their measured series is `expr`)


def substitute(
    expr: str, variables: Mapping[str, str], rate_interval: str = RATE_INTERVAL, range_: str = RANGE
) -> str:
    out = expr.replace("$__rate_interval", rate_interval).replace("$__range", range_)
    for name, value in variables.items():
        out = out.replace(f"${{{name}}}", value).replace(f"${name}", value)
    return out


def dashboard_queries(directory: Path = DASHBOARDS) -> Iterator[Query]:
    for path in sorted(directory.glob("*.json")):
        board = json.loads(path.read_text())
        for panel in board["panels"]:
            for target in panel.get("targets", ()):
                yield Query(f"{board['uid']}/{panel['title']}/{target['refId']}", target["expr"])


def rule_queries(path: Path = RULES) -> Iterator[Query]:
    for group in yaml.safe_load(path.read_text())["groups"]:
        for rule in group["rules"]:
            if "record" in rule:
                yield Query(f"rule/{rule['record']}", rule["expr"].strip())
                continue
            m = _COMPARISON.match(rule["expr"].strip())
            if m is None:
                raise ValueError(f"{rule['alert']}: expr is not `<series> <op> <number>`")
            yield Query(f"alert/{rule['alert']}", m["lhs"], f"{m['op']} {m['num']}")


def metric_names_in(exprs: Iterable[str]) -> set[str]:
    names = set()
    for expr in exprs:
        names |= {re.sub(r"_(bucket|sum|count)$", "", n) for n in _METRIC.findall(expr)}
        if re.search(r"\bup\{", expr):
            names.add("up")
    return names


@dataclass
class Outcome:
    query: Query
    series: int
    sample: str  # "label=value … = value" of the first series, or the allow-list reason
    ok: bool
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.query.key,
            "expr": self.query.expr,
            "threshold": self.query.threshold,
            "series": self.series,
            "value": self.sample,
            "ok": self.ok,
            "note": self.note,
        }


def _describe(result: list[dict[str, Any]]) -> tuple[int, str, bool]:
    """(series, the largest value with its labels, whether any value is a number, not NaN)."""
    real = [r for r in result if not math.isnan(float(r["value"][1]))]
    if not result:
        return 0, "no data", False
    top = max(real, key=lambda r: float(r["value"][1])) if real else result[0]
    hidden = {"__name__", "namespace", "job", "instance"}
    labels = ",".join(f"{k}={v}" for k, v in sorted(top["metric"].items()) if k not in hidden)
    return len(result), f"max {float(top['value'][1]):.4g} {{{labels}}}", bool(real)


def evaluate(
    prom: Prometheus, queries: Iterable[Query], at: float, variables: Mapping[str, str]
) -> list[Outcome]:
    outcomes = []
    for q in queries:
        result = prom.query(substitute(q.expr, variables), at)
        series, sample, has_data = _describe(result)
        reason = ALLOWED.get(q.key)
        if has_data:
            note = "allow-listed but returned data" if reason else ""
            outcomes.append(Outcome(q, series, sample, True, note))
        else:
            outcomes.append(
                Outcome(
                    q, series, sample if series else "no data", reason is not None, reason or ""
                )
            )
    return outcomes


def alert_states(prom: Prometheus) -> dict[str, dict[str, Any]]:
    """Alert name -> {state, health, lastError} as the rule manager evaluated it."""
    out = {}
    for group in prom.api("rules")["groups"]:
        for rule in group["rules"]:
            out[rule["name"]] = {k: rule.get(k) for k in ("type", "state", "health", "lastError")}
    return out


def _scraped(metric: str, names: set[str]) -> bool:
    """A histogram is scraped as <name>_bucket, _sum and _count."""
    return metric in names or f"{metric}_bucket" in names


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
        outcomes = evaluate(prom, queries, at, variables)
        rules = alert_states(prom)
        scraped = prom.metric_names()
        named = metric_names_in(q.expr for q in queries)
        missing = {m: ABSENT.get(m, "") for m in sorted(named) if not _scraped(m, scraped)}
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
