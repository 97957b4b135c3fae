"""A private Prometheus for a local run: installed with apt-get when missing, started on its own
port with its own config and data directory, queried through its HTTP API, stopped.

Used by `make observe-check` (flashcoupon_loadtest.observe, which evaluates every dashboard query
and rule on it) and by `make demo` (which draws the drop overview from its range queries). The
subtle part: the scrape config honours the services' own labels (`honor_labels`), as the
chart's ServiceMonitor does, so the rules and dashboards see the same series as in a cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

from flashcoupon_loadtest.localrun import ROOT, LocalServices, free_port

RULES = ROOT / "charts" / "flashcoupon" / "rules" / "flashcoupon.rules.yaml"
STATE = ROOT / ".stack" / "observe"
NAMESPACE = "local"  # the `namespace` target label of the local run


def ensure_prometheus() -> tuple[str, str]:
    """Paths of `prometheus` and `promtool`; apt-get installs Debian's package when missing."""
    found = shutil.which("prometheus"), shutil.which("promtool")
    if all(found):
        return found[0] or "", found[1] or ""
    sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [*sudo, "apt-get", "install", "-y", "-q", "--no-install-recommends", "prometheus"]
    print("[observe] installing Debian prometheus (includes promtool) ...", flush=True)
    if subprocess.run(install, env=env, capture_output=True, check=False).returncode != 0:
        subprocess.run(
            [*sudo, "apt-get", "update", "-q"], env=env, capture_output=True, check=False
        )
        done = subprocess.run(install, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"apt-get install prometheus failed:\n{done.stderr[-2000:]}")
    prom, tool = shutil.which("prometheus"), shutil.which("promtool")
    if not (prom and tool):
        raise RuntimeError("prometheus installed but not on PATH")
    return prom, tool


@dataclass(frozen=True)
class Target:
    job: str  # e.g. flashcoupon-gateway (the rules' TargetDown matches job=~".*flashcoupon.*")
    address: str  # host:port serving /metrics


def targets_of(services: LocalServices) -> list[Target]:
    return [
        Target(f"flashcoupon-{s.name.rsplit('-', 1)[0]}", f"127.0.0.1:{s.port}")
        for s in services.services
    ]


@dataclass
class Prometheus:
    """A private Prometheus: own port, config and data dir; only 127.0.0.1 traffic."""

    targets: Sequence[Target]
    workdir: Path = STATE
    rule_files: Sequence[Path] = (RULES,)
    interval: str = "1s"
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    _log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> dict[str, Any]:
        jobs: dict[str, list[str]] = {}
        for t in self.targets:
            jobs.setdefault(t.job, []).append(t.address)
        return {
            "global": {"scrape_interval": self.interval, "evaluation_interval": self.interval},
            "rule_files": [str(p) for p in self.rule_files],
            "scrape_configs": [
                {
                    "job_name": job,
                    # As the chart's ServiceMonitor: the services' own `service` label wins.
                    "honor_labels": True,
                    "static_configs": [{"targets": addrs, "labels": {"namespace": NAMESPACE}}],
                }
                for job, addrs in jobs.items()
            ],
        }

    def start(self, binary: str, timeout: float = 30.0) -> Prometheus:
        data = self.workdir / f"data-{self.port}"
        shutil.rmtree(data, ignore_errors=True)
        data.mkdir(parents=True)
        config = self.workdir / f"prometheus-{self.port}.yml"
        config.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        self._log = open(self.workdir / f"prometheus-{self.port}.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={data}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1h",
                "--log.level=warn",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited with {self.proc.returncode}: see {config}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"prometheus on {self.url} not ready after {timeout:.0f}s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        if self._log is not None:
            self._log.close()
            self._log = None
        shutil.rmtree(self.workdir / f"data-{self.port}", ignore_errors=True)

    def api(self, path: str, **params: str | float) -> Any:
        query = urllib.parse.urlencode({k: str(v) for k, v in params.items()})
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=30) as r:
            body = json.load(r)
        if body.get("status") != "success":
            raise RuntimeError(f"{path} {params}: {body}")
        return body["data"]

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        return list(self.api("query", query=expr, time=at)["result"])

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        return list(self.api("query_range", query=expr, start=start, end=end, step=step)["result"])

    def metric_names(self) -> set[str]:
        return set(self.api("label/__name__/values"))

    def wait_scraped(self, n: int, timeout: float = 30.0) -> None:
        """Until `n` targets are up (each has been scraped at least once)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            up = self.query("sum(up)", time.time())
            if up and float(up[0]["value"][1]) >= n:
                return
            time.sleep(0.5)
        raise TimeoutError(f"fewer than {n} targets up after {timeout:.0f}s")


def scrape_local(services: LocalServices) -> Prometheus | None:
    """A private Prometheus scraping the services (1 s), or None when it cannot run here."""
    try:
        binary, _ = ensure_prometheus()
        return Prometheus(targets_of(services)).start(binary)
    except (OSError, RuntimeError) as exc:
        print(f"  no Prometheus, no dashboard.png: {exc}".splitlines()[0])
        return None
