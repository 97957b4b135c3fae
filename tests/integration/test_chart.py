"""The Helm chart, rendered by a real helm for Kubernetes 1.31 with the default values, with
every optional feature on (charts/flashcoupon/ci/all-features-values.yaml) and with per-pod
issuer routing (ci/per-pod-issuers-values.yaml).

helm comes from scripts/tools.sh (built from the Go module proxy when missing; the test does
not skip without it). The rendered objects are checked against the code they deploy: each
container's environment is fed to the service's own settings class and app factory, so a
misnamed variable, a wrong port or a probe on a path the service does not serve fails here.
"""

from __future__ import annotations

import base64
import importlib
import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml
from starlette.routing import Route

from tests.support.asgi import client as asgi_client
from tests.support.deploy import (
    CANONICAL_CRD,
    CHART,
    KUBE_VERSION,
    ROOT,
    command_package,
    documents,
    helm_binary,
)

ALL_FEATURES = CHART / "ci/all-features-values.yaml"
PER_POD = CHART / "ci/per-pod-issuers-values.yaml"
RELEASE = "fc"
# The console scripts that serve HTTP: their settings class and app factory.
APPS = {
    "flashcoupon-gateway": (
        "flashcoupon_gateway.settings:GatewaySettings",
        "flashcoupon_gateway.app",
    ),
    "flashcoupon-issuer": ("flashcoupon_issuer.settings:IssuerSettings", "flashcoupon_issuer.app"),
    "flashcoupon-relay": (
        "flashcoupon_relay.settings:RelaySettings",
        "flashcoupon_relay.app",
    ),
    "flashcoupon-persister": (
        "flashcoupon_persister.settings:PersisterSettings",
        "flashcoupon_persister.app",
    ),
    "flashcoupon-wallet": (
        "flashcoupon_wallet.settings:WalletSettings",
        "flashcoupon_wallet.app",
    ),
}
MONITORING_KINDS = {"ServiceMonitor", "PrometheusRule"}


@pytest.fixture(scope="module")
def helm() -> Path:
    return helm_binary()


def run_helm(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=120)


class Rendered:
    """The objects of one `helm template`, with lookups by kind and component."""

    def __init__(self, objects: list[dict[str, Any]]) -> None:
        self.objects = objects

    def kinds(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for o in self.objects:
            counts[o["kind"]] = counts.get(o["kind"], 0) + 1
        return counts

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def one(self, kind: str, component: str | None = None) -> dict[str, Any]:
        found = [
            o
            for o in self.of(kind)
            if component is None
            or o["metadata"]["labels"].get("app.kubernetes.io/component") == component
        ]
        assert len(found) == 1, f"{kind} {component}: {len(found)} found"
        return found[0]

    def deployments(self) -> dict[str, dict[str, Any]]:
        """Component -> its workload: a Deployment (a StatefulSet for perPod issuers)."""
        return {
            d["metadata"]["labels"]["app.kubernetes.io/component"]: d
            for d in self.of("Deployment") + self.of("StatefulSet")
        }

    def services(self) -> list[dict[str, Any]]:
        """The ClusterIP Services (not the issuers' headless one)."""
        return [s for s in self.of("Service") if s["spec"].get("clusterIP") != "None"]

    def container_env(self, container: dict[str, Any]) -> dict[str, str]:
        """The container's environment as the kubelet would build it from this render."""
        # The endpoints ConfigMap (the others, when enabled, hold Grafana dashboards).
        (config,) = [
            c["data"] for c in self.of("ConfigMap") if "FLASHCOUPON_REDIS_NODES" in c["data"]
        ]
        secret = self.one("Secret")
        secret_data = {
            **{k: base64.b64decode(v).decode() for k, v in secret.get("data", {}).items()},
            **secret.get("stringData", {}),
        }
        env = {}
        for var in container["env"]:
            if "value" in var:
                env[var["name"]] = var["value"]
            elif "configMapKeyRef" in var["valueFrom"]:
                env[var["name"]] = config[var["valueFrom"]["configMapKeyRef"]["key"]]
            else:
                env[var["name"]] = secret_data[var["valueFrom"]["secretKeyRef"]["key"]]
        return env


def render(helm: Path, *args: str) -> Rendered:
    done = run_helm(helm, "template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION, *args)
    assert done.returncode == 0, done.stderr
    return Rendered(documents(done.stdout))


@pytest.fixture(scope="module")
def default(helm: Path) -> Rendered:
    return render(helm)


@pytest.fixture(scope="module")
def full(helm: Path) -> Rendered:
    return render(helm, "-f", str(ALL_FEATURES))


@pytest.fixture(scope="module")
def per_pod(helm: Path) -> Rendered:
    return render(helm, "-f", str(PER_POD))


@pytest.fixture(params=["default", "full", "per_pod"])
def rendered(request: pytest.FixtureRequest) -> Rendered:
    return request.getfixturevalue(request.param)


def load(target: str) -> Any:
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def get_routes(app: Any) -> set[str]:
    """The GET routes of the Starlette app inside `app` (ASGI wrappers keep it as `.app`)."""
    while not hasattr(app, "routes"):
        app = app.app
    return {r.path for r in app.routes if isinstance(r, Route) and "GET" in (r.methods or ())}


async def get_status(app: Any, path: str) -> int:
    """GET through the whole ASGI app (no lifespan: nothing connects)."""
    async with asgi_client(app, "http://pod") as http:
        return (await http.get(path)).status_code


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["template"]["spec"]


def container_port(container: dict[str, Any], name: str) -> dict[str, Any]:
    (port,) = [p for p in container["ports"] if p["name"] == name]
    return port


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


# ---------------------------------------------------------------- helm itself


@pytest.mark.parametrize(
    "values",
    [[], ["-f", str(ALL_FEATURES)], ["-f", str(PER_POD)]],
    ids=["default", "full", "per_pod"],
)
def test_lint_strict(helm: Path, values: list[str]) -> None:
    done = run_helm(helm, "lint", "--strict", "--kube-version", KUBE_VERSION, str(CHART), *values)
    assert done.returncode == 0, done.stdout + done.stderr


def test_values_violating_the_schema_fail_naming_the_field(helm: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad-values.yaml"
    bad.write_text('gateway:\n  replicas: "two"\n')
    done = run_helm(
        helm, "template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION, "-f", str(bad)
    )
    assert done.returncode != 0
    assert "gateway/replicas" in done.stderr or "gateway.replicas" in done.stderr, done.stderr


def test_helm_default_kube_version_is_refused(helm: Path) -> None:
    # Without --kube-version a go-installed helm renders for v1.20; the chart refuses that.
    done = run_helm(helm, "template", RELEASE, str(CHART))
    assert done.returncode != 0
    assert "kubeVersion" in done.stderr and "v1.20" in done.stderr, done.stderr


def test_rendered_crd_is_the_canonical_one(helm: Path) -> None:
    done = run_helm(
        helm, "template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION, "--include-crds"
    )
    crds = [o for o in documents(done.stdout) if o["kind"] == "CustomResourceDefinition"]
    assert crds == [yaml.safe_load(CANONICAL_CRD.read_text())]


# ---------------------------------------------------------------- what is rendered


def test_default_values_render_the_core_objects(default: Rendered) -> None:
    assert default.kinds() == {
        "ConfigMap": 1,
        "Secret": 1,
        "ServiceAccount": 6,
        "Deployment": 6,
        "Service": 6,
        "PodDisruptionBudget": 5,
        "ClusterRole": 1,
        "ClusterRoleBinding": 1,
        "Job": 1,
    }
    assert set(default.deployments()) == {
        "gateway", "issuer", "relay", "persister", "wallet", "operator",
    }  # fmt: skip


def test_optional_features_render_their_objects(full: Rendered) -> None:
    kinds = full.kinds()
    for kind, count in {
        "HorizontalPodAutoscaler": 2,
        "Ingress": 1,
        "NetworkPolicy": 2,
        "ServiceMonitor": 1,
        "PrometheusRule": 1,
        "Role": 1,
        "RoleBinding": 1,
    }.items():
        assert kinds.get(kind) == count, kind
    targets = {h["spec"]["scaleTargetRef"]["name"] for h in full.of("HorizontalPodAutoscaler")}
    deployments = full.deployments()
    assert targets == {deployments[c]["metadata"]["name"] for c in ("gateway", "issuer")}
    for component in ("gateway", "issuer"):  # the HPA owns the replica count
        assert "replicas" not in deployments[component]["spec"]


def test_every_container_runs_a_workspace_command(rendered: Rendered) -> None:
    pods = [pod_spec(o) for o in [*rendered.deployments().values(), *rendered.of("Job")]]
    for spec in pods:
        for container in spec["containers"]:
            assert command_package(container["command"]) is not None, container["command"]


async def test_settings_parse_and_probes_hit_routes_the_services_serve(rendered: Rendered) -> None:
    served = set()
    for component, deployment in rendered.deployments().items():
        (container,) = pod_spec(deployment)["containers"]
        command = container["command"][0]
        env = rendered.container_env(container)
        port = container_port(container, "http")
        probes = [container.get(p) for p in ("livenessProbe", "readinessProbe", "startupProbe")]
        probes = [p["httpGet"] for p in probes if p]
        assert probes and all(p["port"] == port["name"] for p in probes), component
        if command not in APPS:
            # The operator: kopf serves its liveness endpoint at the URL it is given.
            url = urlsplit(env["FLASHCOUPON_OPERATOR_LIVENESS"])
            assert (url.hostname, url.port) == ("0.0.0.0", port["containerPort"])
            assert {p["path"] for p in probes} == {url.path}
            assert "readinessProbe" not in container
            continue
        settings_class, app_module = APPS[command]
        settings = load(settings_class).from_env(env)  # SettingsError names a bad variable
        assert (settings.host, settings.port) == ("0.0.0.0", port["containerPort"]), component
        app = importlib.import_module(app_module).create_app(settings)
        routes = get_routes(app)
        assert {p["path"] for p in probes} <= routes, (component, routes)
        assert {"/healthz", "/readyz", "/metrics"} <= routes
        assert await get_status(app, "/healthz") == 200, component
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        served.add(command)
    assert served == set(APPS)


def test_gateway_forwards_to_the_issuer_and_wallet_services(rendered: Rendered) -> None:
    (container,) = pod_spec(rendered.deployments()["gateway"])["containers"]
    env = rendered.container_env(container)
    for variable, component in (
        ("FLASHCOUPON_GATEWAY_ISSUER_URLS", "issuer"),
        ("FLASHCOUPON_GATEWAY_WALLET_URL", "wallet"),
    ):
        urls = [urlsplit(u) for u in env[variable].split(",")]
        (service,) = [s for s in rendered.services() if component in s["metadata"]["name"]]
        assert all(u.port == service["spec"]["ports"][0]["port"] for u in urls)
        if len(urls) == 1:
            assert urls[0].hostname == service["metadata"]["name"]


@pytest.mark.parametrize("durability", ["none", "replica"])
def test_the_relay_publishes_with_the_issuers_durability(helm: Path, durability: str) -> None:
    # With "replica" the relay must publish only replicated entries, or a coupon answered 503
    # NOT_DURABLE reaches MySQL and is then forgotten by Redis (docs/reliability.md).
    rendered = render(helm, "--set", f"issuer.durability={durability}")
    for component in ("issuer", "relay"):
        (container,) = pod_spec(rendered.deployments()[component])["containers"]
        env = rendered.container_env(container)
        assert env[f"FLASHCOUPON_{component.upper()}_DURABILITY"] == durability, component


def test_per_pod_routing_lists_every_issuer_pod_by_its_stable_name(
    default: Rendered, per_pod: Rendered
) -> None:
    assert default.deployments()["issuer"]["kind"] == "Deployment"
    issuer = per_pod.deployments()["issuer"]
    assert issuer["kind"] == "StatefulSet"
    replicas = issuer["spec"]["replicas"]
    assert replicas == 3
    (headless,) = [s for s in per_pod.of("Service") if s["spec"].get("clusterIP") == "None"]
    assert headless["metadata"]["name"] == issuer["spec"]["serviceName"]
    assert selects(headless["spec"]["selector"], issuer["spec"]["template"]["metadata"]["labels"])
    (container,) = pod_spec(per_pod.deployments()["gateway"])["containers"]
    env = per_pod.container_env(container)
    settings = load(APPS["flashcoupon-gateway"][0]).from_env(env)
    name, service = issuer["metadata"]["name"], headless["metadata"]["name"]
    expected = [f"{name}-{i}.{service}.default.svc" for i in range(replicas)]
    assert [urlsplit(u).hostname for u in settings.issuer_urls] == expected
    assert settings.issuer_routing == "shopper"  # the gateway keeps each shopper on one pod


def test_services_select_their_own_pods_on_the_http_port(rendered: Rendered) -> None:
    deployments = rendered.deployments()
    for service in rendered.of("Service"):
        component = service["metadata"]["labels"]["app.kubernetes.io/component"]
        pod = deployments[component]["spec"]["template"]
        assert selects(service["spec"]["selector"], pod["metadata"]["labels"])
        others = [d for c, d in deployments.items() if c != component]
        assert not any(
            selects(service["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"])
            for d in others
        )
        (port,) = service["spec"]["ports"]
        (container,) = pod["spec"]["containers"]
        assert port["targetPort"] in {p["name"] for p in container["ports"]}


def test_the_operator_service_leads_to_its_metrics_server(rendered: Rendered) -> None:
    # The ServiceMonitor scrapes every Service's `http` port; on the operator's Service that
    # port must reach prometheus_client's server, not kopf's liveness endpoint.
    operator = rendered.deployments()["operator"]
    (container,) = pod_spec(operator)["containers"]
    env = rendered.container_env(container)
    settings = load("flashcoupon_operator.__main__:OperatorSettings").from_env(env)
    metrics = container_port(container, "metrics")
    assert settings.metrics_port == metrics["containerPort"] != 0
    assert urlsplit(settings.liveness).port != metrics["containerPort"]
    service = rendered.one("Service", "operator")
    (port,) = service["spec"]["ports"]
    assert (port["name"], port["targetPort"]) == ("http", "metrics")
    assert selects(service["spec"]["selector"], operator["spec"]["template"]["metadata"]["labels"])


def test_pods_are_hardened(rendered: Rendered) -> None:
    for obj in [*rendered.deployments().values(), *rendered.of("Job")]:
        spec = pod_spec(obj)
        name = obj["metadata"]["name"]
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["runAsUser"] > 0
        is_operator = obj["metadata"]["labels"]["app.kubernetes.io/component"] == "operator"
        assert spec["automountServiceAccountToken"] is is_operator, name
        for container in spec["containers"]:
            security = container["securityContext"]
            assert security["readOnlyRootFilesystem"] is True, name
            assert security["allowPrivilegeEscalation"] is False, name
            assert security["capabilities"]["drop"] == ["ALL"], name
            assert {"cpu", "memory"} <= set(container["resources"]["requests"]), name
            assert {"cpu", "memory"} <= set(container["resources"]["limits"]), name


def test_operator_runs_alone_with_recreate(rendered: Rendered) -> None:
    spec = rendered.deployments()["operator"]["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}
    assert not [p for p in rendered.of("PodDisruptionBudget") if "operator" in str(p["spec"])]


def rules_grant(rules: list[dict[str, Any]], group: str, resource: str, verbs: set[str]) -> bool:
    return any(
        group in r["apiGroups"] and resource in r["resources"] and verbs <= set(r["verbs"])
        for r in rules
    )


def test_operator_rbac_covers_what_kopf_does_on_couponevents(rendered: Rendered) -> None:
    crd = yaml.safe_load(CANONICAL_CRD.read_text())
    group, plural = crd["spec"]["group"], crd["spec"]["names"]["plural"]
    account = pod_spec(rendered.deployments()["operator"])["serviceAccountName"]
    bindings = rendered.of("ClusterRoleBinding") + rendered.of("RoleBinding")
    roles = {
        (r["kind"], r["metadata"]["name"], r["metadata"].get("namespace")): r["rules"]
        for r in rendered.of("ClusterRole") + rendered.of("Role")
    }
    rules: list[dict[str, Any]] = []
    for binding in bindings:
        assert [s["name"] for s in binding["subjects"]] == [account]
        ref = binding["roleRef"]
        rules += roles[(ref["kind"], ref["name"], binding["metadata"].get("namespace"))]
    for resource, verbs in (
        (plural, {"list", "watch", "patch"}),
        (f"{plural}/status", {"patch"}),
        (f"{plural}/finalizers", {"update"}),
    ):
        assert rules_grant(rules, group, resource, verbs), resource
    assert rules_grant(rules, "", "events", {"create"})
    assert rules_grant(rules, "apiextensions.k8s.io", "customresourcedefinitions", {"watch"})
    assert not any("*" in r["verbs"] or "*" in r["resources"] for r in rules)


def test_watching_one_namespace_grants_couponevents_only_there(full: Rendered) -> None:
    role = full.one("Role")
    assert role["metadata"]["namespace"] == "shop"
    (container,) = pod_spec(full.deployments()["operator"])["containers"]
    assert full.container_env(container)["FLASHCOUPON_OPERATOR_NAMESPACE"] == "shop"
    cluster_rules = full.one("ClusterRole")["rules"]
    assert not rules_grant(cluster_rules, "flashcoupon.io", "couponevents", {"watch"})


def test_only_the_gateway_may_reach_issuer_and_wallet(full: Rendered) -> None:
    deployments = full.deployments()
    gateway_pod = deployments["gateway"]["spec"]["template"]["metadata"]["labels"]
    for component in ("issuer", "wallet"):
        policy = full.one("NetworkPolicy", component)
        protected = deployments[component]["spec"]["template"]["metadata"]["labels"]
        assert selects(policy["spec"]["podSelector"]["matchLabels"], protected)
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        (rule,) = policy["spec"]["ingress"]
        pod_peers = [p["podSelector"]["matchLabels"] for p in rule["from"] if "podSelector" in p]
        assert pod_peers and all(selects(p, gateway_pod) for p in pod_peers)
        others = [d for c, d in deployments.items() if c != "gateway"]
        for other in others:
            labels = other["spec"]["template"]["metadata"]["labels"]
            assert not any(selects(p, labels) for p in pod_peers), component
        (port,) = pod_spec(deployments[component])["containers"][0]["ports"]
        assert rule["ports"] == [{"protocol": "TCP", "port": port["containerPort"]}]


def test_monitoring_objects_carry_the_configured_release_label(helm: Path, full: Rendered) -> None:
    for kind in MONITORING_KINDS:
        assert full.one(kind)["metadata"]["labels"]["release"] == "prom-stack"
    other = render(helm, "-f", str(ALL_FEATURES), "--set", "monitoring.release=observability")
    for kind in MONITORING_KINDS:
        assert other.one(kind)["metadata"]["labels"]["release"] == "observability"


@pytest.mark.parametrize("name", ["full", "per_pod"])
def test_service_monitor_scrapes_every_service_once(
    name: str, request: pytest.FixtureRequest
) -> None:
    rendered: Rendered = request.getfixturevalue(name)
    monitor = rendered.one("ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics" and endpoint["honorLabels"] is True
    selector = monitor["spec"]["selector"]
    (excluded,) = selector["matchExpressions"]
    assert excluded["operator"] == "DoesNotExist"
    for service in rendered.of("Service"):
        labels = service["metadata"]["labels"]
        chosen = selects(selector["matchLabels"], labels) and excluded["key"] not in labels
        assert chosen == (service in rendered.services()), service["metadata"]["name"]
        assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert len(rendered.services()) == 6


def exported_metrics() -> set[str]:
    names = set()
    sources = ("services/*/src/**/*.py", "libs/common/src/**/*.py", "operator/src/**/*.py")
    for path in [p for pattern in sources for p in ROOT.glob(pattern)]:
        names |= set(re.findall(r'"(flashcoupon_[a-z_]+)"', path.read_text()))
    return names


def test_alerts_query_metrics_the_services_export(full: Rendered) -> None:
    exported = exported_metrics()
    rules = full.one("PrometheusRule")["spec"]["groups"][0]["rules"]
    assert len(rules) >= 6
    for rule in rules:
        assert rule["annotations"]["runbook_url"].startswith("https://runbooks.example.com/")
        for metric in re.findall(r"\b(flashcoupon_[a-z_]+)", rule["expr"]):
            base = re.sub(r"_(bucket|sum|count)$", "", metric)
            assert base in exported, f"{rule['alert']}: {metric} is not exported by any service"
    issue_route = importlib.import_module("flashcoupon_gateway.routes").ISSUE_PATH
    assert any(f'route="{issue_route}"' in r["expr"] for r in rules)


def test_dashboards_are_configmaps_for_the_grafana_sidecar(helm: Path, full: Rendered) -> None:
    def boards(rendered: Rendered) -> dict[str, dict[str, Any]]:
        return {
            c["metadata"]["name"]: c
            for c in rendered.of("ConfigMap")
            if "grafana_dashboard" in c["metadata"]["labels"]
            or "team/dashboards" in c["metadata"]["labels"]
        }

    shipped = sorted(p.name for p in (CHART / "dashboards").glob("*.json"))
    found = boards(full)
    assert sorted(k for c in found.values() for k in c["data"]) == shipped
    for c in found.values():
        assert c["metadata"]["labels"]["grafana_dashboard"] == "1"
        (text,) = c["data"].values()
        assert json.loads(text)["uid"].startswith("flashcoupon-")
    other = render(
        helm, "-f", str(ALL_FEATURES), "--set", "monitoring.dashboards.label=team/dashboards",
        "--set", "monitoring.dashboards.labelValue=yes",
    )  # fmt: skip
    assert {c["metadata"]["labels"]["team/dashboards"] for c in boards(other).values()} == {"yes"}
    assert not boards(render(helm))  # off by default


# ---------------------------------------------------------------- Kubernetes API schemas


def validate(obj: dict[str, Any]) -> None:
    kubernetes_validate.validate(obj, KUBE_VERSION, strict=True)


def test_objects_validate_against_the_kubernetes_1_31_schemas(rendered: Rendered) -> None:
    checked = 0
    for obj in rendered.objects:
        if obj["kind"] in MONITORING_KINDS:
            continue  # CRD kinds of the Prometheus Operator: not in kubernetes-validate
        validate(obj)
        checked += 1
    assert checked >= 27
    assert {o["kind"] for o in rendered.objects} >= {"Deployment", "Service", "Secret"}


@pytest.mark.parametrize(
    "breaks",
    [
        lambda d: d["spec"].__setitem__("replicas", "two"),
        lambda d: pod_spec(d)["containers"][0].__setitem__("imagePullPolicy", 3),
        lambda d: pod_spec(d).__setitem__("unknownField", True),
    ],
    ids=["type", "enum-type", "unknown-field"],
)
def test_the_validator_rejects_a_broken_deployment(
    default: Rendered, breaks: Callable[[dict[str, Any]], None]
) -> None:
    deployment = yaml.safe_load(yaml.safe_dump(default.deployments()["issuer"]))
    breaks(deployment)
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(deployment)
