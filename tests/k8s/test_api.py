"""What the API server itself enforces: the CRD's CEL rules, and the operator's least privilege."""

from __future__ import annotations

from tests.support.k8s import Release
from tests.support.names import random_name

BAD_SHARES = """
apiVersion: flashcoupon.io/v1alpha1
kind: CouponEvent
metadata: {name: NAME}
spec:
  quantity: 10
  startAt: "2030-01-01T00:00:00Z"
  endAt: "2030-01-02T00:00:00Z"
  tiers:
    - {name: a, discount: {type: fixed, amount: 100}, share: 60}
    - {name: b, discount: {type: fixed, amount: 200}, share: 30}
"""


def test_invalid_couponevent_is_refused_with_the_cel_message(release: Release) -> None:
    name = random_name("bad")
    proc = release.kubectl("apply", "-f", "-", stdin=BAD_SHARES.replace("NAME", name), check=False)
    assert proc.returncode != 0
    assert "tiers' shares must sum to 100" in proc.stderr, proc.stderr
    assert release.kubectl("get", "couponevent", name, check=False).returncode != 0


def test_operator_runs_with_the_charts_rbac_not_cluster_admin(release: Release) -> None:
    pods = release.get_json("pods", "-l", "app.kubernetes.io/component=operator")["items"]
    assert pods and all(p["status"]["phase"] == "Running" for p in pods)
    sa = pods[0]["spec"]["serviceAccountName"]
    who = f"--as=system:serviceaccount:{release.namespace}:{sa}"

    def can(*args: str) -> bool:
        proc = release.kubectl("auth", "can-i", who, *args, check=False)
        return proc.stdout.strip() == "yes"

    assert can("patch", "couponevents.flashcoupon.io", "--subresource=status")
    assert can("watch", "couponevents.flashcoupon.io")
    assert not can("get", "secrets")
    assert not can("create", "pods")
    assert not can("delete", "nodes")
    assert not can("*", "*", "--all-namespaces")
