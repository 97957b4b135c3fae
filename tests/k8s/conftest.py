"""The k8s tier: the product on a real single-node Kubernetes (docs/deploy.md, "The dev cluster").

The `release` fixture runs `scripts/k8s-deploy.sh up` once per session — the cluster from real
components (built once, cached under .cache/k8s), the four images (podman, imported into
containerd), the stores on the node address, `helm upgrade --install --wait` — all idempotent,
so a warm run only checks that everything is there. Nothing is skipped for being absent.
Each test uses its own CouponEvent names, so the tests share the release.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/k8s/" in str(item.fspath):
            item.add_marker(pytest.mark.timeout(2400))


@dataclass(frozen=True)
class Release:
    env: dict[str, str]

    @property
    def namespace(self) -> str:
        return self.env["K8S_NAMESPACE"]

    @property
    def gateway_url(self) -> str:
        return self.env["GATEWAY_URL"]

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True,
                timeout: float = 120) -> subprocess.CompletedProcess[str]:  # fmt: skip
        cmd = [f"{self.env['K8S_BIN']}/kubectl", "--kubeconfig", self.env["KUBECONFIG"],
               "-n", self.namespace, *args]  # fmt: skip
        proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {proc.stderr}")
        return proc

    def get_json(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def store_env(self) -> dict[str, str]:
        return {k: v for k, v in self.env.items() if k.startswith("FLASHCOUPON_")}


def deploy_env() -> dict[str, str]:
    out = subprocess.run([str(ROOT / "scripts/k8s-deploy.sh"), "env"], capture_output=True,
                         text=True, check=True, timeout=60).stdout  # fmt: skip
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


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


def wait_until(check: Callable[[], Any], within: float, what: str, every: float = 0.5) -> Any:
    deadline = time.time() + within
    last: Any = None
    while time.time() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"{what} not within {within:.0f}s (last: {last!r})")
