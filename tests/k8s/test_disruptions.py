"""What Kubernetes does to the pods mid-drop, and what the product promises anyway.

Each burst is `k8s/dev/demo.py` (the `make k8s-demo` driver and invariant report, through the
gateway's NodePort) with first presses spread over a few seconds, and the disruption fired from
here at a moment measured from the event's startAt:

* `helm upgrade` to a rebuilt issuer image: the issuers roll (readiness, SIGTERM drain, preStop,
  the PDB) with zero 5xx and every invariant PASS;
* a gateway pod and an issuer pod force-deleted (no grace): no acknowledged coupon is lost
  (invariants 4 and 5: every 201 has its MySQL row, MySQL = Redis one for one);
* the operator pod killed as a large event is created (its preload is a few Redis calls, so
  that is "mid-preload"): the new one resumes and the event is Ready with exactly its quantity.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.support.k8s import Release, burst_with, wait_for
from tests.support.names import random_name
from tests.support.paths import ROOT

DECIDED = {"ISSUED", "SOLD_OUT", "DUPLICATE", "RATE_LIMITED"}


def invariant(report: dict, number: int) -> dict:
    return next(c for c in report["invariants"] if c["invariant"] == number)


def pods(release: Release, component: str) -> list[str]:
    doc = release.get_json("pods", "-l", f"app.kubernetes.io/component={component}")
    return [
        p["metadata"]["name"] for p in doc["items"] if not p["metadata"].get("deletionTimestamp")
    ]


def issuer_images(release: Release) -> set[str]:
    doc = release.get_json("pods", "-l", "app.kubernetes.io/component=issuer")
    return {
        c["image"]
        for p in doc["items"]
        if not p["metadata"].get("deletionTimestamp")
        for c in p["spec"]["containers"]
    }


def wait_rolled_out(release: Release, component: str) -> None:
    release.kubectl("rollout", "status", f"deployment/flashcoupon-{component}", "--timeout=180s",
                    timeout=200)  # fmt: skip


def test_helm_upgrade_rolls_the_issuers_mid_burst_with_no_5xx(
    release: Release, tmp_path: Path
) -> None:
    env = release.env
    ctr = ["ctr", "--address", env["K8S_CONTAINERD_SOCK"], "-n", "k8s.io"]
    tag = subprocess.run([str(ROOT / "scripts/k8s-images.sh"), "tag"], capture_output=True,
                         text=True, check=True).stdout.strip()  # fmt: skip
    current = f"localhost/flashcoupon-issuer:{tag}"
    rebuilt = f"localhost/flashcoupon-issuer:{tag}-roll-{random_name('r')[-6:]}"
    subprocess.run([*ctr, "images", "tag", current, rebuilt], check=True, capture_output=True)
    upgrade = [f"{ROOT}/.cache/bin/helm", "upgrade", env["K8S_RELEASE"],
               str(ROOT / "charts/flashcoupon"), "--kubeconfig", env["KUBECONFIG"],
               "-n", release.namespace, "--reuse-values", "--wait", "--timeout", "5m",
               "--set", f"images.issuer.ref={rebuilt}"]  # fmt: skip
    result: dict[str, subprocess.CompletedProcess[str]] = {}

    def roll() -> None:
        result["helm"] = subprocess.run(upgrade, capture_output=True, text=True, timeout=400)

    try:
        report = burst_with(release, tmp_path, roll, at=1.0, spread=15.0, users=30_000)
        assert result["helm"].returncode == 0, result["helm"].stderr
        # helm's --wait can return while old pods are still terminating: wait for the rollout,
        # then look only at pods that are not being deleted.
        wait_rolled_out(release, "issuer")
        assert issuer_images(release) == {rebuilt}
        outcomes = report["summary"]["outcomes"]
        assert set(outcomes) <= DECIDED, (outcomes, report["_output"][-3000:])
        assert report["passed"], report["_output"][-4000:]
    finally:
        # Back to the release's own values (k8s-deploy.sh sets images.tag; no ref).
        subprocess.run([*upgrade[:-2], "--set", "images.issuer.ref="], capture_output=True,
                       timeout=400)  # fmt: skip
        subprocess.run([*ctr, "images", "rm", rebuilt], capture_output=True)


def test_gateway_and_issuer_force_deleted_mid_burst_lose_no_acknowledged_coupon(
    release: Release, tmp_path: Path
) -> None:
    victims = [pods(release, "gateway")[0], pods(release, "issuer")[0]]

    def kill() -> None:
        release.kubectl("delete", "pod", *victims, "--force", "--grace-period=0", "--wait=false")

    report = burst_with(release, tmp_path, kill, at=1.5)
    for number in (1, 2, 3, 4, 5):
        assert invariant(report, number)["verdict"] == "PASS", (invariant(report, number),
                                                     report["_output"][-3000:])  # fmt: skip
    assert report["redis_issued"] == report["persisted"]
    for component in ("gateway", "issuer"):
        wait_rolled_out(release, component)


def test_operator_killed_as_a_large_event_is_created_resumes_and_completes_exactly(
    release: Release,
) -> None:
    # Provisioning is a few Redis calls whatever the quantity (counters, not code lists: a
    # million coupons are Ready in under a second), so "mid-preload" is a window of
    # milliseconds: the operator is force-killed in the same instant the event is created,
    # and whichever of the two operators does the work, the result must be exact.
    name = random_name("preload")
    quantity = 1_000_000
    manifest = (ROOT / "k8s/examples/demo-drop.yaml").read_text()
    doc = re.sub(r"(?m)^  name: demo-drop$", f"  name: {name}", manifest)
    doc = re.sub(r"(?m)^  quantity: \d+$", f"  quantity: {quantity}", doc)
    doc = re.sub(r'(?m)^  startAt: ".*"$', '  startAt: "2029-12-31T00:00:00Z"', doc)
    doc = re.sub(r"(?m)^  warmup: .*$", "  warmup: 87600h", doc)
    old = pods(release, "operator")
    try:
        release.kubectl("apply", "-f", "-", stdin=doc)
        release.kubectl("delete", "pod", *old, "--force", "--grace-period=0", "--wait=false")
        wait_for(lambda: set(pods(release, "operator")) - set(old), 60, "a new operator pod")
        status = wait_for(
            lambda: (s := release.get_json("couponevent", name).get("status", {})).get("phase")
            == "Ready" and s,
            300, "phase Ready after the operator restart", every=1.0,
        )  # fmt: skip
        assert status["remaining"] == quantity, status
        assert status.get("issued", 0) == 0, status
        preloaded = next(c for c in status["conditions"] if c["type"] == "Preloaded")
        assert preloaded["status"] == "True", status
    finally:
        release.kubectl("delete", "couponevent", name, "--wait=true", "--timeout=180s",
                        check=False, timeout=200)  # fmt: skip
        wait_rolled_out(release, "operator")
