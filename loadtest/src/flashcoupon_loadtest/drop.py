"""A demo drop's event and pipeline: the manifest, `couponctl apply`, a private Kafka topic,
and watching Redis issued vs MySQL persisted until the pipeline has drained.

The event is applied the way a platform team would do it without Kubernetes: an example
manifest from k8s/examples/ with a fresh name, the requested quantity and startAt a few
seconds ahead, fed to `couponctl apply -f`. Each run gets its own `coupon-issued` topic (and
persister group) so a demo on a machine shared with other runs or tests sees only its own
records; the relay is told to move only this event's outbox (FLASHCOUPON_RELAY_EVENTS).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml

from flashcoupon_loadtest.invariants import persisted_count

ROOT = Path(__file__).resolve().parents[3]
DEFAULT_MANIFEST = ROOT / "k8s" / "examples" / "demo-drop.yaml"


def _rfc3339(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def demo_manifest(
    source: Path,
    *,
    name: str,
    quantity: int,
    start_at: datetime,
    open_for: timedelta = timedelta(hours=1),
) -> dict[str, Any]:
    """The example manifest renamed, resized and re-timed; waiting room off."""
    doc: dict[str, Any] = yaml.safe_load(source.read_text())
    doc["metadata"] = {**doc.get("metadata", {}), "name": name}
    spec = doc["spec"]
    spec["quantity"] = quantity
    spec["startAt"] = _rfc3339(start_at)
    spec["endAt"] = _rfc3339(start_at + open_for)
    spec["warmup"] = "1m"
    admission = spec.setdefault("admission", {})
    admission.setdefault("waitingRoom", {})["enabled"] = False
    return doc


def couponctl_apply(doc: Mapping[str, Any], workdir: Path, env: Mapping[str, str]) -> str:
    """Run `couponctl apply -f` on the manifest; returns its output, raises on failure."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / f"{doc['metadata']['name']}.yaml"
    path.write_text(yaml.safe_dump(dict(doc), sort_keys=False))
    couponctl = Path(sys.executable).parent / "couponctl"
    proc = subprocess.run(
        [str(couponctl), "apply", "-f", str(path)],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"couponctl apply failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}"
        )
    return proc.stdout.strip()


class PipelineWatch:
    """Samples (wall time, Redis issued counter, MySQL rows) of one event in the background."""

    def __init__(self, redis: Any, engine: Any, event_id: str, interval: float = 0.25) -> None:
        self.redis, self.engine, self.event_id, self.interval = redis, engine, event_id, interval
        self.samples: list[tuple[float, int, int]] = []
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def last(self) -> tuple[float, int, int]:
        return self.samples[-1] if self.samples else (time.time(), 0, 0)

    async def sample(self) -> tuple[float, int, int]:
        from flashcoupon_common.event_state import read_state

        state = await read_state(self.redis, self.event_id)
        persisted = await persisted_count(self.engine, self.event_id)
        row = (time.time(), state.issued if state else 0, persisted)
        self.samples.append(row)
        return row

    def start(self) -> None:
        self._stopping = False

        async def loop() -> None:
            while not self._stopping:
                await self.sample()
                await asyncio.sleep(self.interval)

        self._task = asyncio.create_task(loop())

    async def stop(self) -> None:
        if self._task is not None:
            # The flag as well as the cancel: a cancellation that lands in a driver's cleanup
            # (SQLAlchemy's connection close) can be swallowed, and the loop would then poll
            # forever with stop() awaiting it (a k8s-tier demo hung so for 20 minutes).
            self._stopping = True
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def wait_drained(self, within: float) -> float | None:
        """Wait until MySQL rows == Redis issued (> 0 or the event issued nothing).

        Returns the wall time it first held, or None on timeout.
        """
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            t, issued, persisted = await self.sample()
            if persisted >= issued:
                return t
            await asyncio.sleep(self.interval)
        return None
