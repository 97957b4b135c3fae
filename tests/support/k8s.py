"""The dev Kubernetes cluster's release as tests see it (kubectl, its environment)."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.support.paths import ROOT


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


def wait_for(check: Callable[[], Any], within: float, what: str, every: float = 0.5) -> Any:
    """Poll a synchronous `check` until it returns something truthy, and return that."""
    deadline = time.time() + within
    last: Any = None
    while time.time() < deadline:
        last = check()
        if last:
            return last
        time.sleep(every)
    raise AssertionError(f"{what} not within {within:.0f}s (last: {last!r})")
