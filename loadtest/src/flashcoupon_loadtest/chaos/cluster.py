"""The dev cluster's release from the host, and a burst with an action fired mid-burst.

Shared by `make chaos-k8s` (chaos/k8s_run.py) and the tests/k8s tier (tests/support/k8s.py
re-exports it): `Release` wraps kubectl with `scripts/k8s-deploy.sh env`; `burst_with` runs
`k8s/dev/demo.py` (a CouponEvent, a shopper burst through the gateway's NodePort, the
invariant report) and calls an action at a moment measured from the event's startAt.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[4]
START_AT = re.compile(r"startAt (\d\d:\d\d:\d\d\.\d+) UTC")


@dataclass(frozen=True)
class Release:
    env: dict[str, str]

    @property
    def namespace(self) -> str:
        return self.env["K8S_NAMESPACE"]

    @property
    def gateway_url(self) -> str:
        return self.env["GATEWAY_URL"]

    @property
    def prometheus_url(self) -> str:
        """The dev cluster's Prometheus (k8s/dev/prometheus.yaml) on its NodePort."""
        return self.env["PROMETHEUS_URL"]

    def kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        cmd = [
            f"{self.env['K8S_BIN']}/kubectl",
            "--kubeconfig",
            self.env["KUBECONFIG"],
            "-n",
            self.namespace,
            *args,
        ]
        proc = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)}: {proc.stderr}")
        return proc

    def get_json(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def store_env(self) -> dict[str, str]:
        return {k: v for k, v in self.env.items() if k.startswith("FLASHCOUPON_")}

    def ctr(self) -> list[str]:
        """containerd's CLI on the cluster's own socket, in the CRI namespace."""
        return ["ctr", "--address", self.env["K8S_CONTAINERD_SOCK"], "-n", "k8s.io"]

    def pods(self, component: str) -> list[dict[str, Any]]:
        """The component's pods that are not being deleted."""
        doc = self.get_json("pods", "-l", f"app.kubernetes.io/component={component}")
        return [p for p in doc["items"] if not p["metadata"].get("deletionTimestamp")]

    def pod_names(self, component: str) -> list[str]:
        return [p["metadata"]["name"] for p in self.pods(component)]

    def wait_rolled_out(self, component: str) -> None:
        self.kubectl(
            "rollout",
            "status",
            f"deployment/flashcoupon-{component}",
            "--timeout=180s",
            timeout=200,
        )


def deploy_env() -> dict[str, str]:
    out = subprocess.run(
        [str(ROOT / "scripts/k8s-deploy.sh"), "env"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
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


def start_at_of(line: str, today: datetime) -> float | None:
    """startAt (epoch seconds) from the demo's "kubectl apply: ... startAt HH:MM:SS.fff UTC"."""
    found = START_AT.search(line)
    if not found:
        return None
    clock = datetime.strptime(found.group(1), "%H:%M:%S.%f").time()
    return datetime.combine(today.date(), clock, tzinfo=UTC).timestamp()


def burst_with(
    release: Release,
    results: Path,
    action: Callable[[], None],
    *,
    at: float,
    users: int = 20_000,
    coupons: int = 2_000,
    spread: float = 8.0,
) -> dict[str, Any]:
    """Run the demo; call `action` `at` seconds after startAt; return its report (demo.json).

    The report gains `_output` (the demo's output), `_returncode`, `_start_at` and
    `_fired` / `_done` (epoch seconds the action began and returned).
    """
    cmd = [
        sys.executable,
        str(ROOT / "k8s/dev/demo.py"),
        "--users",
        str(users),
        "--coupons",
        str(coupons),
        "--concurrency",
        "64",
        "--duration",
        str(spread),
        "--drain-timeout",
        "120",
        "--results-dir",
        str(results),
    ]
    lines: list[str] = []
    times: dict[str, float] = {}
    fired = threading.Event()
    failed: list[BaseException] = []
    # `with` closes the pipe: an unclosed one is a ResourceWarning, an error under pytest.
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            start = start_at_of(line, datetime.now(UTC))
            if start is not None and "start_at" not in times:
                times["start_at"] = start

                def fire(delay: float = start + at - time.time()) -> None:
                    time.sleep(max(0.0, delay))
                    times["fired"] = time.time()
                    try:
                        action()
                    except BaseException as exc:  # noqa: BLE001 — raised below, once the demo has ended
                        failed.append(exc)
                    finally:
                        times["done"] = time.time()
                        fired.set()

                threading.Thread(target=fire, daemon=True).start()
        proc.wait(timeout=600)
    output = "".join(lines)
    results.mkdir(parents=True, exist_ok=True)
    (results / "demo.out").write_text(output)
    # The action may outlast the burst (a `helm upgrade --wait` of up to 5 min).
    assert fired.wait(420), output[-4000:]
    if failed:
        raise failed[0]
    report_path = results / "demo.json"
    assert report_path.exists(), output[-12000:]
    report: dict[str, Any] = json.loads(report_path.read_text())
    report["_output"] = output
    report["_returncode"] = proc.returncode
    report["_start_at"] = times["start_at"]
    report["_fired"], report["_done"] = times["fired"], times["done"]
    return report
