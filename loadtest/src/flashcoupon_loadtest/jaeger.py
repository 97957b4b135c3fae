"""The local Jaeger v2 (scripts/tracing.sh) from Python: where it listens, starting it, the
OTEL_* variables that point a service at it, and reading a trace back from its query API.

The trace test and bench_tracing use it; ports follow the same JAEGER_*_PORT variables as the
script, so both always agree on where Jaeger is.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "tracing.sh"


def _addr(env: Mapping[str, str], port_var: str, default: int) -> str:
    return f"http://{env.get('JAEGER_HOST', '127.0.0.1')}:{env.get(port_var, default)}"


def query_url(env: Mapping[str, str] | None = None) -> str:
    return _addr(os.environ if env is None else env, "JAEGER_QUERY_PORT", 16686)


def otel_env(env: Mapping[str, str] | None = None, *, delay_ms: int = 200) -> dict[str, str]:
    """The standard OTEL_* variables that make a service export its spans to this Jaeger.

    `delay_ms` is the batch span processor's export interval (the SDK's default is 5 s)."""
    e = os.environ if env is None else env
    return {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": _addr(e, "JAEGER_OTLP_HTTP_PORT", 14318),
        "OTEL_BSP_SCHEDULE_DELAY": str(delay_ms),
    }


def running() -> bool:
    return subprocess.run([str(SCRIPT), "status"], capture_output=True).returncode == 0


def up() -> None:
    """Start it (building it first when missing: minutes, once); returns when its API answers."""
    subprocess.run([str(SCRIPT), "up"], check=True)


def down() -> None:
    subprocess.run([str(SCRIPT), "down"], check=True)


def get_trace(trace_id: str, env: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """The trace as Jaeger's query API (/api/traces/{id}) holds it now, or None."""
    try:
        with urllib.request.urlopen(f"{query_url(env)}/api/traces/{trace_id}", timeout=5) as r:
            data = json.load(r).get("data") or []
    except urllib.error.HTTPError as exc:
        if exc.code == 404:  # not (yet) stored
            return None
        raise
    return data[0] if data else None


def services_of(trace: Mapping[str, Any]) -> dict[str, list[str]]:
    """Service name -> the names of its spans in the trace."""
    processes = trace.get("processes", {})
    out: dict[str, list[str]] = {}
    for s in trace.get("spans", []):
        name = processes.get(s["processID"], {}).get("serviceName", "?")
        out.setdefault(name, []).append(s["operationName"])
    return out
