"""The Grafana dashboards in charts/flashcoupon/dashboards/, checked without a Grafana.

Grafana cannot run here (AGPL), so two offline checks stand in for it:
* a focused JSON schema of what Grafana needs to load and draw each panel (uid, gridPos,
  datasource, targets with refId and expr, a unit) and of the variables every panel reads;
* a round trip through grafana-foundation-sdk's typed dashboard model (generated from
  Grafana's own schema): a key the model does not know is dropped, so a typo shows as a diff.
Its `from_json` checks neither types nor required fields, hence the schema. Whether each query
returns data is proven on a real Prometheus by `make observe-check`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "charts/flashcoupon/dashboards"
# Stable uids: links and bookmarks point at them; changing one breaks them.
UIDS = {
    "drop-overview.json": "flashcoupon-drop",
    "red-per-service.json": "flashcoupon-red",
    "pipeline.json": "flashcoupon-pipeline",
}
# Grafana unit ids the panels use (public/app/features/... valueFormats).
UNITS = {"s", "ms", "cps", "reqps", "ops", "percentunit", "short", "none", "bytes"}
DS = {
    "type": "object",
    "required": ["type", "uid"],
    "properties": {"type": {"const": "prometheus"}, "uid": {"const": "${datasource}"}},
}
PANEL = {
    "type": "object",
    "required": ["id", "type", "title", "gridPos", "datasource", "targets", "fieldConfig"],
    "properties": {
        "id": {"type": "integer", "minimum": 1},
        "type": {"enum": ["timeseries", "stat", "gauge", "bargauge", "table"]},
        "title": {"type": "string", "minLength": 1},
        "datasource": DS,
        "gridPos": {
            "type": "object",
            "required": ["h", "w", "x", "y"],
            "properties": {
                "h": {"type": "integer", "minimum": 1},
                "w": {"type": "integer", "minimum": 1, "maximum": 24},
                "x": {"type": "integer", "minimum": 0, "maximum": 23},
                "y": {"type": "integer", "minimum": 0},
            },
        },
        "targets": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["refId", "expr", "datasource"],
                "properties": {
                    "refId": {"type": "string", "pattern": "^[A-Z]$"},
                    "expr": {"type": "string", "minLength": 1},
                    "datasource": DS,
                    "legendFormat": {"type": "string"},
                },
            },
        },
        "fieldConfig": {
            "type": "object",
            "required": ["defaults", "overrides"],
            "properties": {
                "defaults": {
                    "type": "object",
                    "required": ["unit"],
                    "properties": {"unit": {"enum": sorted(UNITS)}},
                }
            },
        },
    },
}
ROW = {
    "type": "object",
    "required": ["id", "type", "title", "gridPos", "collapsed"],
    "properties": {"type": {"const": "row"}, "collapsed": {"const": False}},
}
VARIABLE = {
    "type": "object",
    "required": ["name", "type", "query"],
    "properties": {"name": {"type": "string"}, "type": {"enum": ["datasource", "query"]}},
}
SCHEMA = {
    "type": "object",
    "required": ["uid", "title", "schemaVersion", "time", "templating", "panels", "tags"],
    "properties": {
        "uid": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,40}$"},
        "title": {"type": "string", "minLength": 1},
        "schemaVersion": {"type": "integer", "minimum": 36},
        "time": {"type": "object", "required": ["from", "to"]},
        "tags": {"type": "array", "contains": {"const": "flashcoupon"}},
        "templating": {
            "type": "object",
            "required": ["list"],
            "properties": {"list": {"type": "array", "items": VARIABLE}},
        },
        "panels": {
            "type": "array",
            "minItems": 1,
            "items": {"if": {"properties": {"type": {"const": "row"}}}, "then": ROW, "else": PANEL},
        },
    },
}
METRIC = re.compile(r"\b(flashcoupon[_:][a-z_:]*[a-z])\b(\{[^}]*\})?")


def load(name: str) -> dict[str, Any]:
    return json.loads((DASHBOARDS / name).read_text())


def panels(board: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in board["panels"] if p["type"] != "row"]


def test_the_chart_ships_exactly_the_known_dashboards() -> None:
    assert sorted(p.name for p in DASHBOARDS.glob("*")) == sorted(UIDS)


@pytest.mark.parametrize("name", sorted(UIDS))
def test_structure_grafana_needs(name: str) -> None:
    board = load(name)
    jsonschema.validate(board, SCHEMA)
    assert board["uid"] == UIDS[name]
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells: set[tuple[int, int]] = set()
    for p in board["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & mine, f"{p['title']} overlaps another panel"
        cells |= mine
    for p in panels(board):
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]


@pytest.mark.parametrize("name", sorted(UIDS))
def test_variables_and_every_selector_filter_by_namespace(name: str) -> None:
    board = load(name)
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert list(variables) == ["datasource", "namespace", "event"]
    assert variables["datasource"]["query"] == "prometheus"
    for var in ("namespace", "event"):
        assert variables[var]["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert variables[var]["includeAll"] and variables[var]["allValue"] == ".*"
    for p in panels(board):
        for t in p["targets"]:
            found = METRIC.findall(t["expr"])
            assert found, (p["title"], t["expr"])
            for metric, selector in found:
                assert 'namespace=~"$namespace"' in selector, (p["title"], metric)
                if re.search(r"\bevent\b", selector):
                    assert 'event=~"$event"' in selector or 'event!="unknown"' in selector


@pytest.mark.parametrize("name", sorted(UIDS))
def test_round_trip_through_grafanas_typed_model_loses_nothing(name: str) -> None:
    board = load(name)
    again = json.loads(json.dumps(Dashboard.from_json(board), cls=JSONEncoder))
    assert unknown_keys(board, again) == []


def unknown_keys(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict):
        out = []
        for key, value in a.items():
            if not isinstance(b, dict) or key not in b:
                out.append(f"{path}.{key}")
            else:
                out += unknown_keys(value, b[key], f"{path}.{key}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        return [
            k
            for i, (x, y) in enumerate(zip(a, b, strict=True))
            for k in unknown_keys(x, y, f"{path}[{i}]")
        ]
    return []


def test_every_metric_a_dashboard_reads_is_documented() -> None:
    documented = (ROOT / "docs/metrics.md").read_text()
    for name in UIDS:
        for p in panels(load(name)):
            for t in p["targets"]:
                for metric, _ in METRIC.findall(t["expr"]):
                    base = re.sub(r"_(bucket|sum|count)$", "", metric)
                    assert f"`{base}`" in documented, f"{name} {p['title']}: {base}"


def test_drop_overview_shows_what_the_issue_asks_for() -> None:
    titles = " | ".join(p["title"] for p in panels(load("drop-overview.json"))).lower()
    for wanted in ("issued / s", "remaining", "outcomes", "time to sell out", "shoppers"):
        assert wanted in titles
    latency = next(p for p in panels(load("drop-overview.json")) if "Latency" in p["title"])
    assert [t["legendFormat"] for t in latency["targets"]] == ["p50", "p99"]
    assert latency["fieldConfig"]["defaults"]["unit"] == "s"
