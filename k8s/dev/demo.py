"""`make k8s-demo`: the coupon drop of `make demo`, on the dev cluster, the way a platform team
runs it — `kubectl apply` of a CouponEvent, the in-cluster operator preloading and activating
it, shoppers through the gateway's Service, `kubectl delete` running the finalizer.

    uv run python k8s/dev/demo.py [--users N] [--coupons N] [--lead S] [...demo.py's flags]

Needs `make k8s-deploy` (the release, and its stores on the node address). Prints every line of
`kubectl get couponevents -w` with the time it arrived, then the same burst, driver and invariant
report as `make demo` (aimed at the NodePort on 127.0.0.1), then checks that the operator's own
status went Pending → Ready → Active (at startAt) → SoldOut with Persisted = quantity, and that
deleting the event removed its Redis keys while MySQL kept its rows. Exits 1 on any failure.
The phase timeline is written to phases.json next to the report (--results-dir, by default
loadtest/results/k8s/).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from flashcoupon_common import keys
from flashcoupon_common.db.engine import create_engine
from flashcoupon_common.redis_cluster import create_redis_cluster
from flashcoupon_common.settings import MysqlSettings, RedisSettings
from flashcoupon_loadtest import demo, localrun
from flashcoupon_loadtest.chaos.cluster import deploy_env
from flashcoupon_loadtest.drop import DEFAULT_MANIFEST, demo_manifest
from flashcoupon_loadtest.invariants import persisted_count

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "loadtest" / "results" / "k8s"
WARMUP_S = 5
ACTIVE_WITHIN_S = 2.0


def say(text: str = "") -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


class Kubectl:
    def __init__(self, env: dict[str, str]) -> None:
        self.binary = str(Path(env["K8S_BIN"]) / "kubectl")
        self.base = [self.binary, "--kubeconfig", env["KUBECONFIG"], "-n", env["K8S_NAMESPACE"]]

    def run(self, *args: str, stdin: str | None = None, timeout: float = 60) -> str:
        proc = subprocess.run(
            [*self.base, *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
        return proc.stdout

    def status(self, name: str) -> dict[str, Any]:
        doc = json.loads(self.run("get", "couponevent", name, "-o", "json"))
        return dict(doc.get("status") or {})


class PhaseWatch:
    """`kubectl get couponevents -w` in the background, every line stamped as it arrives."""

    def __init__(self, kubectl: Kubectl, name: str) -> None:
        self.name = name
        self.lines: list[tuple[float, str]] = []
        self.proc = subprocess.Popen(
            [
                *kubectl.base,
                "get",
                "couponevents",
                "-w",
                "--field-selector",
                f"metadata.name={name}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            now = time.time()
            self.lines.append((now, line.rstrip()))
            say(f"  {_clock(now)}  {line.rstrip()}")

    def stop(self) -> None:
        # Reap the process and close its pipe: a pipe left open is a ResourceWarning, and the
        # tests run this demo under `filterwarnings = error`.
        self.proc.terminate()
        self.proc.wait(timeout=10)
        self.thread.join(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def transitions(self) -> list[tuple[float, str]]:
        """(first time seen, phase) for each phase the watch showed, in order."""
        header = next((line for _, line in self.lines if line.startswith("NAME")), "")
        col = header.find("PHASE")
        seen: list[tuple[float, str]] = []
        for t, line in self.lines:
            if col < 0 or not line.startswith(self.name):
                continue
            phase = line[col:].split()[0] if len(line) > col and line[col] != " " else "<none>"
            if not seen or seen[-1][1] != phase:
                seen.append((t, phase))
        return seen


def _clock(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%H:%M:%S.%f")[:-3]


def wait_status(kubectl: Kubectl, name: str, ok: Any, within: float, what: str) -> dict[str, Any]:
    deadline = time.time() + within
    status: dict[str, Any] = {}
    while time.time() < deadline:
        status = kubectl.status(name)
        if ok(status):
            return status
        time.sleep(0.25)
    raise RuntimeError(f"{name}: {what} not reached within {within:.0f}s; status {status}")


async def run(argv: list[str]) -> int:
    env = deploy_env()
    os.environ.update({k: v for k, v in env.items() if k.startswith("FLASHCOUPON_")})
    args = demo.parse_args(
        [
            "--lead",
            "15",
            "--results-dir",
            str(RESULTS),
            "--jwt-secret",
            env["FLASHCOUPON_GATEWAY_JWT_SECRET"],
            *argv,
        ]
    )
    if not args.target:
        args.target = [env["GATEWAY_URL"]]
    kubectl = Kubectl(env)
    t_begin = time.time()
    name = args.event or f"k8s-{datetime.now(UTC):%H%M%S}-{secrets.token_hex(3)}"
    start_at = datetime.now(UTC) + timedelta(seconds=args.lead)
    doc = demo_manifest(DEFAULT_MANIFEST, name=name, quantity=args.coupons, start_at=start_at)
    # Applied before its warm-up window, so the operator shows Pending before it preloads.
    doc["spec"]["warmup"] = f"{WARMUP_S}s"
    redis = create_redis_cluster(RedisSettings.from_env())
    engine = create_engine(MysqlSettings.from_env(), pool_size=2)
    watch = PhaseWatch(kubectl, name)
    failures: list[str] = []
    try:
        # Right after pods are replaced (a rollout, the disruption tests just before this in
        # `make test`) a connection to the NodePort was once refused although every gateway
        # pod was ready, and one refused connection fails the driver's preparation: the burst
        # waits until every connection through the node is answered.
        for target in args.target:
            await asyncio.to_thread(localrun.wait_ready, f"{target}/readyz", timeout=90, times=20)
        await asyncio.sleep(0.5)  # the watch's first list (empty) before the event exists
        when = _clock(start_at.timestamp())
        say(f"kubectl apply: CouponEvent {name}, {args.coupons:,} coupons, startAt {when} UTC")
        say("  " + kubectl.run("apply", "-f", "-", stdin=yaml.safe_dump(doc)).strip())
        ready = lambda s: s.get("phase") == "Ready"  # noqa: E731
        await asyncio.to_thread(wait_status, kubectl, name, ready, args.lead, "phase Ready")
        rc = await demo._drop(args, name, start_at, args.target, redis, engine, t_begin)
        if rc != 0:
            failures.append("the invariant report failed")
        final = await asyncio.to_thread(
            wait_status,
            kubectl,
            name,
            lambda s: s.get("phase") == "SoldOut" and s.get("persisted") == args.coupons,
            60,
            f"phase SoldOut with Persisted {args.coupons}",
        )
        shown = {k: final.get(k) for k in ("phase", "issued", "remaining", "persisted")}
        say(f"operator status: {json.dumps(shown)}")
        await asyncio.sleep(1.0)
    except BaseException:
        # A failed run leaves no event behind (an Active one would keep the operator busy).
        with contextlib.suppress(Exception):
            kubectl.run("delete", "couponevent", name, "--wait=false", "--ignore-not-found")
        raise
    finally:
        watch.stop()
    transitions = watch.transitions()
    phases = [p for _, p in transitions]
    say("\nphase transitions (kubectl get couponevents -w):")
    for t, phase in transitions:
        say(f"  {_clock(t)}  {phase:<10}  startAt{t - start_at.timestamp():+7.2f}s")
    expected = ["Pending", "Ready", "Active", "SoldOut"]
    if [p for p in phases if p in expected] != expected:
        failures.append(
            f"phases {phases}, expected {expected} in order (Preloading may sit between)"
        )
    active = next((t for t, p in transitions if p == "Active"), None)
    # The operator's status follows a timer (operator.refreshSeconds, 1 s in k8s/dev/values.yaml)
    # and the watch line arrives after it; the issuers themselves open at startAt exactly.
    if active is None or not 0 <= active - start_at.timestamp() < ACTIVE_WITHIN_S:
        late = "never" if active is None else f"{active - start_at.timestamp():+.2f}s"
        failures.append(f"Active seen {late} from startAt (allowed: < {ACTIVE_WITHIN_S}s)")

    rows = await persisted_count(engine, name)
    say(f"\nkubectl delete couponevent {name}")
    t0 = time.time()
    kubectl.run("delete", "couponevent", name, "--wait=true", timeout=120)
    say(f"  deleted in {time.time() - t0:.1f}s (the finalizer ran)")
    left = [k for k in keys.event_keys(name) if await redis.exists(k)]
    registered = await redis.sismember(keys.EVENTS_REGISTRY, name)
    rows_after = await persisted_count(engine, name)
    say(f"  Redis keys left: {len(left)}; in the events registry: {bool(registered)}")
    say(f"  MySQL rows: {rows_after:,} (before delete {rows:,})")
    if left or registered:
        failures.append(f"Redis state left after delete: {left} registered={registered}")
    if rows_after != rows or rows != args.coupons:
        failures.append(f"MySQL rows {rows} -> {rows_after}, expected {args.coupons}")
    await redis.aclose()
    await engine.dispose()

    args.results_dir.mkdir(parents=True, exist_ok=True)
    (args.results_dir / "phases.json").write_text(
        json.dumps(
            {
                "event": name,
                "start_at": start_at.timestamp(),
                "transitions": [
                    {
                        "at": _clock(t),
                        "phase": p,
                        "from_start_at_s": round(t - start_at.timestamp(), 3),
                    }
                    for t, p in transitions
                ],
                "failures": failures,
            },
            indent=2,
        )
    )
    say("\n" + ("k8s demo: PASS" if not failures else "k8s demo: FAIL\n  " + "\n  ".join(failures)))
    return 0 if not failures else 1


def main() -> int:
    return asyncio.run(run(sys.argv[1:]))


if __name__ == "__main__":
    sys.exit(main())
