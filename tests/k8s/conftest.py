"""The k8s tier: the product on a real single-node Kubernetes (docs/deploy.md, "The dev cluster").

The `release` fixture runs `scripts/k8s-deploy.sh up` once per session — the cluster from real
components (built once, cached under .cache/k8s), the four images and the Prometheus one
(podman, imported into containerd), the stores on the node address, `helm upgrade --install
--wait`, the dev Prometheus — all idempotent, so a warm run only checks that everything is
there. Nothing is skipped for being absent. Each test uses its own CouponEvent names, so the
tests share the release.
"""

from __future__ import annotations

import subprocess
import time

import pytest

from tests.support.k8s import Release, deploy_env
from tests.support.paths import ROOT


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/k8s/" in str(item.fspath):
            item.add_marker(pytest.mark.timeout(2400))


@pytest.fixture(scope="session")
def release() -> Release:
    t0 = time.time()
    log = ROOT / ".stack" / "k8s-deploy-up.log"  # each step's time, for a slow CI run
    log.parent.mkdir(exist_ok=True)
    with log.open("w") as out:
        proc = subprocess.run([str(ROOT / "scripts/k8s-deploy.sh"), "up"], stdout=out,
                              stderr=subprocess.STDOUT, timeout=3600)  # fmt: skip
    assert proc.returncode == 0, log.read_text()[-6000:]
    print(f"\n[k8s] cluster, images and release ready in {time.time() - t0:.0f}s ({log})")
    return Release(deploy_env())
