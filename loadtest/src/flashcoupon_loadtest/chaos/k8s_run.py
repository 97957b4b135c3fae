"""`python -m flashcoupon_loadtest.chaos.k8s_run [--fault ROW[,ROW]]` (`make chaos-k8s`).

Runs the pod-level rows (chaos/k8s.py) one after another against the dev release
(`scripts/k8s-deploy.sh up` first): before each row every Deployment is rolled out; the burst
(chaos/cluster.py `burst_with`) fires the row's fault mid-burst; afterwards the Deployment is
polled until all its pods are Ready again. Prints the table, writes
loadtest/results/chaos-k8s.json, exits 1 when a row failed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from flashcoupon_loadtest.chaos.cluster import ROOT, Release, burst_with, deploy_env, wait_for
from flashcoupon_loadtest.chaos.k8s import ROWS, K8sFigures, K8sRow, Proc, figures, select_shim
from flashcoupon_loadtest.chaos.k8s import format_table as k8s_table
from flashcoupon_loadtest.chaos.runner import git_commit

RESULTS = ROOT / "loadtest" / "results"
COMPONENTS = ("gateway", "issuer", "relay", "persister")


def processes() -> list[Proc]:
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        out.append(Proc(int(entry.name), ppid, tuple(a.decode() for a in argv if a)))
    return out


def all_ready(release: Release, component: str) -> bool:
    doc = release.get_json("deployment", f"flashcoupon-{component}")
    want = doc["spec"].get("replicas", 1)
    status = doc.get("status", {})
    pods = release.pods(component)
    ready = [
        p
        for p in pods
        if any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in p.get("status", {}).get("conditions", [])
        )
    ]
    return bool(status.get("readyReplicas", 0) >= want and len(ready) == len(pods) == want)


def container_id(pod: dict[str, Any]) -> str:
    statuses = pod.get("status", {}).get("containerStatuses") or [{}]
    return str(statuses[0].get("containerID", "")).split("://", 1)[-1]


def kill_shim(release: Release, component: str) -> tuple[str, str, str]:
    """SIGKILL the shim of one of the component's pods: (what, the pod, its container id)."""
    pod = release.pods(component)[0]
    container = container_id(pod)
    info = json.loads(
        subprocess.run(
            [*release.ctr(), "containers", "info", container],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    sandbox = info.get("Spec", {}).get("annotations", {}).get("io.kubernetes.cri.sandbox-id", "")
    tasks = subprocess.run(
        [*release.ctr(), "tasks", "ls"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    task_pid = next((int(t.split()[1]) for t in tasks if t.startswith(container)), None)
    shim = select_shim(
        processes(), {sandbox, container}, release.env["K8S_CONTAINERD_SOCK"], task_pid
    )
    os.kill(shim.pid, signal.SIGKILL)
    name = pod["metadata"]["name"]
    return f"{name}: killed {shim.argv[0]} pid {shim.pid}", name, container


def helm_upgrade(release: Release, ref: str) -> subprocess.CompletedProcess[str]:
    """`helm upgrade --reuse-values --wait` with the issuers' image ref ("" restores the tag)."""
    env = release.env
    cmd = [
        f"{ROOT}/.cache/bin/helm",
        "upgrade",
        env["K8S_RELEASE"],
        str(ROOT / "charts/flashcoupon"),
        "--kubeconfig",
        env["KUBECONFIG"],
        "-n",
        release.namespace,
        "--reuse-values",
        "--wait",
        "--timeout",
        "5m",
        "--set",
        f"images.issuer.ref={ref}",
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=400)


def run_row(release: Release, row: K8sRow, results: Path) -> dict[str, Any]:
    for component in COMPONENTS:
        release.wait_rolled_out(component)
    marks: dict[str, Any] = {}
    cleanups: list[Callable[[], object]] = []
    rolled = ""
    if row.kind == "helm":
        tag = subprocess.run(
            [str(ROOT / "scripts/k8s-images.sh"), "tag"], capture_output=True, text=True, check=True
        ).stdout.strip()
        rolled = f"localhost/flashcoupon-issuer:{tag}-roll-{int(time.time())}"
        subprocess.run(
            [*release.ctr(), "images", "tag", f"localhost/flashcoupon-issuer:{tag}", rolled],
            check=True,
            capture_output=True,
        )
        # Back to the release's own values (k8s-deploy.sh sets images.tag; no ref).
        cleanups.append(lambda: helm_upgrade(release, ""))
        cleanups.append(
            lambda: subprocess.run([*release.ctr(), "images", "rm", rolled], capture_output=True)
        )

    def action() -> None:
        if row.kind == "delete":
            victim = release.pod_names(row.component)[0]
            release.kubectl("delete", "pod", victim, "--force", "--grace-period=0", "--wait=false")
            marks["note"] = f"deleted {victim}"
        elif row.kind == "shim":
            marks["note"], pod, old = kill_shim(release, row.component)
            marks["end"] = time.time()
            # The pod keeps its name: wait for the kubelet to have restarted its container
            # (a new container id), or the Ready check below would pass at once.
            wait_for(
                lambda: container_id(release.get_json("pod", pod)) not in ("", old),
                300,
                f"{pod} restarted",
            )
        else:
            proc = helm_upgrade(release, rolled)
            marks["note"] = f"helm upgrade to {rolled}: exit {proc.returncode} {proc.stderr[-300:]}"
            marks["error"] = proc.returncode != 0
        marks.setdefault("end", time.time())
        # Until the Deployment is whole again: the "ready s" figure.
        wait_for(lambda: all_ready(release, row.component), 300, f"{row.component} Ready", 0.25)
        marks["ready"] = time.time()

    try:
        report = burst_with(
            release,
            results,
            action,
            at=row.at,
            users=row.users,
            coupons=row.coupons,
            spread=row.spread,
        )
    finally:
        for cleanup in cleanups:
            cleanup()
    fired = report["_fired"]
    figs = figures(report, fault=(fired, marks["end"]), replaced_s=round(marks["ready"] - fired, 1))
    return {
        "report": report,
        "figures": figs,
        "note": marks.get("note", ""),
        "error": marks.get("error", False),
    }


def verdict(figs: K8sFigures | None, error: bool) -> str:
    return "FAIL" if figs is None or error or figs.failures() else "PASS"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m flashcoupon_loadtest.chaos.k8s_run", description=__doc__
    )
    ap.add_argument("--fault", default="", help=f"rows, comma-separated: {', '.join(ROWS)}")
    ap.add_argument("--out", type=Path, default=RESULTS / "chaos-k8s.json")
    args = ap.parse_args(argv)
    names = [n for n in args.fault.split(",") if n] or list(ROWS)
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        raise SystemExit(f"unknown row(s) {unknown}; known: {', '.join(ROWS)}")
    release = Release(deploy_env())
    began = time.monotonic()
    table: list[tuple[str, K8sFigures | None, str]] = []
    notes: list[str] = []
    doc_rows: list[dict[str, Any]] = []
    for name in names:
        row, t0 = ROWS[name], time.monotonic()
        results = RESULTS / "chaos-k8s" / name
        try:
            out = run_row(release, row, results)
        except Exception as exc:  # noqa: BLE001 — the row fails, the next one still runs
            table.append((name, None, "FAIL"))
            notes.append(f"{name}: ERROR {exc!s:.400} (output {results}/demo.out)")
            doc_rows.append({"row": name, "what": row.what, "verdict": "FAIL", "error": str(exc)})
            print(f"[chaos-k8s] {name}: FAIL ({exc!s:.200})", flush=True)
            continue
        figs, report = out["figures"], out["report"]
        v = verdict(figs, out["error"])
        table.append((name, figs, v))
        notes.append(f"{name}: {out['note'].strip()}")
        if figs.failures():
            notes.append(f"{name}: FAIL ({', '.join(figs.failures())}); {results}/demo.out")
        if figs.wrong:
            notes.append(f"{name}: wrong answers {figs.wrong}")
        if report["_returncode"] != 0:
            notes.append(f"{name}: the demo exited {report['_returncode']} ({results}/demo.out)")
        doc_rows.append(
            {
                "row": name,
                "what": row.what,
                "verdict": v,
                "note": out["note"],
                "figures": {**figs.__dict__, "wrong_total": figs.wrong_total},
                "demo_returncode": report["_returncode"],
                "invariants": report["invariants"],
            }
        )
        print(f"[chaos-k8s] {name}: {v} in {time.monotonic() - t0:.0f}s", flush=True)
    print(k8s_table(table, notes))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "generated": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "seconds": round(time.monotonic() - began),
        "passed": all(v != "FAIL" for _, _, v in table),
        "rows": doc_rows,
    }
    args.out.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    print(f"[chaos-k8s] {args.out} written; {time.monotonic() - began:.0f}s in all")
    return 0 if doc["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
