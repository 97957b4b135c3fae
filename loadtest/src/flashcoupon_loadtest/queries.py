"""The PromQL that the dashboards and rules hold, and what evaluating it on Prometheus found.

Pure parsing (`dashboard_queries`, `rule_queries`, `substitute`, `metric_names_in`) plus
`evaluate`, which asks a running Prometheus. An alert is split into its measured series and its
threshold (`<series> <op> <number>`, the rules file's convention), so the series is evaluated
even while the alert does not fire.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from flashcoupon_loadtest.localrun import ROOT
from flashcoupon_loadtest.prometheus import RULES, Prometheus

DASHBOARDS = ROOT / "charts" / "flashcoupon" / "dashboards"
# What Grafana would substitute; $__rate_interval at a 1 s scrape would be 4 s: a minute keeps
# the short burst inside every window when the queries run after the drain.
RATE_INTERVAL, RANGE = "1m", "5m"
_METRIC = re.compile(r"\b(flashcoupon_[a-z_]*[a-z])\b")
_COMPARISON = re.compile(r"^(?P<lhs>.+?)\s*(?P<op>>=|<=|==|!=|>|<)\s*(?P<num>-?[0-9.]+)\s*$", re.S)


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
    prom: Prometheus,
    queries: Iterable[Query],
    at: float,
    variables: Mapping[str, str],
    allowed: Mapping[str, str],
) -> list[Outcome]:
    """Each query at `at`; one with no data passes only when `allowed` says why."""
    outcomes = []
    for q in queries:
        result = prom.query(substitute(q.expr, variables), at)
        series, sample, has_data = _describe(result)
        reason = allowed.get(q.key)
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


def scraped_as(metric: str, names: set[str]) -> bool:
    """A histogram is scraped as <name>_bucket, _sum and _count."""
    return metric in names or f"{metric}_bucket" in names
