"""A real Prometheus scrapes the release through the chart's ServiceMonitor (issue 14, item 7).

k8s/dev/prometheus.yaml asks the Prometheus Operator (built from its Go module, run on the node
by scripts/k8s.sh) for a Prometheus 2.42 that selects ServiceMonitors and PrometheusRules by
`release: dev-prometheus`, the label k8s/dev/values.yaml gives the chart's. Proven here:
every Service of the release has its ready pods up as targets of the ServiceMonitor's scrape
pool, the PrometheusRule's every alert and recording rule is loaded and evaluates, shopper
traffic shows in the scraped metrics, and a ServiceMonitor without the label is left out.

Scrapes and rule evaluations run every 5 s here; the deadlines allow for a loaded 2-core CI.
"""

from __future__ import annotations

import base64
import gzip
import importlib
from typing import Any

import httpx
import yaml

from tests.support.deploy import CHART
from tests.support.k8s import Release, wait_for
from tests.support.names import random_name

RULES = CHART / "rules/flashcoupon.rules.yaml"
SELECTED = {"release": "dev-prometheus"}  # k8s/dev/values.yaml, k8s/dev/prometheus.yaml
PROMETHEUS_NAMESPACE, PROMETHEUS = "monitoring", "dev"  # k8s/dev/prometheus.yaml
NEVER_EVALUATED = "0001-01-01T00:00:00Z"  # Prometheus's zero time
GATEWAY_SERVICE = {
    "app.kubernetes.io/name": "flashcoupon",
    "app.kubernetes.io/component": "gateway",
}
ISSUE_PATH: str = importlib.import_module("flashcoupon_gateway.routes").ISSUE_PATH


def api(release: Release, path: str, **params: str) -> Any:
    """The `data` of a Prometheus HTTP API answer."""
    answer = httpx.get(f"{release.prometheus_url}/api/v1/{path}", params=params, timeout=10)
    answer.raise_for_status()
    body = answer.json()
    assert body["status"] == "success", body
    return body["data"]


def scalar(release: Release, query: str) -> float | None:
    """The value of a one-series instant query, None while it has no data."""
    result = api(release, "query", query=query)["result"]
    return float(result[0]["value"][1]) if result else None


def scrape_pool(namespace: str, monitor: str) -> str:
    """The scrape pool (job_name) the operator gives a ServiceMonitor's first endpoint."""
    return f"serviceMonitor/{namespace}/{monitor}/0"


def source_rule_names(groups: list[dict[str, Any]]) -> set[str]:
    """The alert and recording rule names of a rules file's groups."""
    return {r.get("alert") or r["record"] for g in groups for r in g["rules"]}


def is_ready(pod: dict[str, Any]) -> bool:
    conditions = pod["status"].get("conditions", [])
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def operator_config(release: Release) -> str:
    """The configuration the Prometheus Operator generated (the pod reads it from this Secret)."""
    secret = release.get_json("secret", "-n", PROMETHEUS_NAMESPACE, f"prometheus-{PROMETHEUS}")
    return gzip.decompress(base64.b64decode(secret["data"]["prometheus.yaml.gz"])).decode()


def release_services(release: Release) -> list[dict[str, Any]]:
    """The Services the chart's ServiceMonitor selects: all of the release's but the headless."""
    found = release.get_json("services", "-l", "app.kubernetes.io/name=flashcoupon")["items"]
    return [s for s in found if "flashcoupon.io/headless" not in s["metadata"]["labels"]]


def release_monitor(release: Release) -> str:
    (monitor,) = release.get_json("servicemonitors", "-l", "release=dev-prometheus")["items"]
    name: str = monitor["metadata"]["name"]
    return name


def test_every_service_of_the_release_is_scraped_through_its_service_monitor(
    release: Release,
) -> None:
    pool = scrape_pool(release.namespace, release_monitor(release))
    services = [s["metadata"]["name"] for s in release_services(release)]
    assert len(services) == 6, services  # five HTTP services and the operator's /metrics

    def ready_pods(service: str) -> set[str]:
        pods = release.pods(service.removeprefix("flashcoupon-"))
        return {p["metadata"]["name"] for p in pods if is_ready(p)}

    def scraped() -> dict[str, set[str]] | None:
        """Service -> its pods that are up in the pool, once that is every ready pod of each."""
        targets = [t for t in api(release, "targets", state="active")["activeTargets"]
                   if t["scrapePool"] == pool]  # fmt: skip
        up: dict[str, set[str]] = {s: set() for s in services}
        for t in targets:
            if t["health"] == "up" and t["labels"]["job"] in up:
                up[t["labels"]["job"]].add(t["labels"]["pod"])
        return up if all(up[s] and ready_pods(s) <= up[s] for s in services) else None

    up = wait_for(scraped, 120, f"every ready pod of {services} up in {pool}", every=2)
    # The same through PromQL: up == 1 for each of those pods, under its Service's job.
    result = api(release, "query", query=f'up{{namespace="{release.namespace}"}}')["result"]
    values = {(r["metric"]["job"], r["metric"]["pod"]): r["value"][1] for r in result}
    for service, pods in up.items():
        assert all(values.get((service, pod)) == "1" for pod in pods), (service, values)


def test_the_prometheus_rule_is_loaded_and_every_rule_evaluates(release: Release) -> None:
    wanted = source_rule_names(yaml.safe_load(RULES.read_text())["groups"])
    assert len(wanted) >= 15

    def loaded() -> list[dict[str, Any]] | None:
        groups = [g for g in api(release, "rules")["groups"]
                  if f"/{release.namespace}-" in g["file"]]  # fmt: skip
        rules = [r for g in groups for r in g["rules"]]
        done = {r["name"] for r in rules} >= wanted and all(
            r["lastEvaluation"] != NEVER_EVALUATED for r in rules
        )
        return rules if done else None

    rules = wait_for(loaded, 90, f"the {len(wanted)} rules of {RULES.name} evaluated", every=2)
    # Health "ok": Prometheus 2.42's engine (Debian promtool's) evaluates every expression.
    failing = {r["name"]: r.get("lastError") for r in rules if r["health"] != "ok"}
    assert not failing, failing


def test_flashcoupon_metrics_are_scraped_and_shopper_requests_show(release: Release) -> None:
    namespace = release.namespace
    # Every Service's job has flashcoupon_* series (gauges and counters exist from start-up).
    ours = f'{{namespace="{namespace}", __name__=~"flashcoupon_.+"}}'
    by_job = api(release, "query", query=f"count by (job) ({ours})")["result"]
    services = {s["metadata"]["name"] for s in release_services(release)}
    assert {r["metric"]["job"] for r in by_job} == services, by_job
    # A small burst on the issue route (no token: answered 401, recorded all the same).
    query = (f'sum(flashcoupon_http_requests_total{{namespace="{namespace}", service="gateway",'
             f' route="{ISSUE_PATH}"}})')  # fmt: skip
    before = scalar(release, query) or 0.0
    burst = 40
    with httpx.Client(base_url=release.gateway_url, timeout=10) as http:
        for _ in range(burst):
            event = random_name("promq")
            assert http.post(f"/v1/events/{event}/issue").status_code in {401, 429}
    wait_for(lambda: (scalar(release, query) or 0.0) >= before + burst, 60,
             f"{burst} more gateway issue requests in Prometheus", every=1)  # fmt: skip


def monitor_manifest(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "selector": {"matchLabels": GATEWAY_SERVICE},
            "endpoints": [{"port": "http", "path": "/metrics", "interval": "5s"}],
        },
    }


def test_a_service_monitor_without_the_release_label_is_not_selected(release: Release) -> None:
    name = random_name("sm")
    chosen, ignored = f"{name}-chosen", f"{name}-ignored"
    manifests = [monitor_manifest(chosen, {**SELECTED, "test": name}),
                 monitor_manifest(ignored, {"test": name})]  # fmt: skip
    release.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(manifests))
    try:
        chosen_pool = scrape_pool(release.namespace, chosen)

        def chosen_up() -> bool:
            targets = api(release, "targets", state="active")["activeTargets"]
            return any(t["scrapePool"] == chosen_pool and t["health"] == "up" for t in targets)

        # Both were applied together, so the operator's configuration that brings `chosen` had
        # `ignored` in front of it too.
        wait_for(lambda: chosen_pool in operator_config(release), 60,
                 f"{chosen_pool} in the operator's configuration")  # fmt: skip
        # The kubelet rewrites a pod's Secret volume only when it syncs the pod: periodically
        # (measured here: 74 s) or at once when the pod changes, as on this annotation. The
        # config-reloader then sees the new file within its 5 s --watch-interval
        # (k8s/dev/prometheus.yaml says why it needs one) and has Prometheus reload: 6 s.
        # Restarting the pod instead would lose the samples the other tests look at.
        sync = f"flashcoupon.io/config-sync={name}"
        pod = f"prometheus-{PROMETHEUS}-0"
        release.kubectl("annotate", "--overwrite", "-n", PROMETHEUS_NAMESPACE, "pod", pod, sync)
        wait_for(chosen_up, 120, f"{chosen_pool} scraped", every=2)
        config = api(release, "status/config")["yaml"]
        assert chosen_pool in config
        assert ignored not in config and ignored not in operator_config(release)
        pools = {t["scrapePool"] for t in api(release, "targets")["activeTargets"]}
        assert scrape_pool(release.namespace, ignored) not in pools
    finally:
        release.kubectl("delete", "servicemonitor", chosen, ignored, "--ignore-not-found")
