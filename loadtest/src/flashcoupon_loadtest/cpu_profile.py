"""`make profile`: where a service's CPU goes per request, by layer and by function (py-spy).

    uv run python -m flashcoupon_loadtest.cpu_profile [--paths hello,issuer,gateway]
        [--seconds 10] [--users 20000] [--concurrency 64] [--top 20] [--sample issuer]

Issue 13 asks to profile before optimising and to say where the time went. This is that
profile, reproducible: the services start as `make bench-gateway` starts them (its paths, the
same driver and shoppers), and for each path in turn py-spy samples the one process serving
it (the hello-world, the issuer, the gateway) while the path's rounds run back to back. The
samples are sorted by the frame they were taken in:

  server       the HTTP server and the event loop: uvicorn, httptools, uvloop, asyncio and
               flashcoupon_common.httpserver (whose transport write is the answer's send())
               — what a hello-world request pays too
  application  the project's own code (flashcoupon_*)
  libraries    everything else (starlette, orjson, prometheus_client, redis, ...)

A layer's µs per request is its share of the samples times the process's CPU per request
measured in the same rounds (/proc), so the paths compare in the same run: the issuer's
server layer against hello-world's whole request, say. `--sample issuer` samples the issuer
instead while each path runs (any process the path watches: on the gateway path, what a
batched press costs the issuer behind it). py-spy samples without pausing the
process (`--nonblocking`), so it costs the process little, but the rounds' req/s are not
benchmark figures. Writes loadtest/results/profile.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from statistics import median
from typing import Any

from flashcoupon_loadtest import driver
from flashcoupon_loadtest.bench_gateway import (
    PathSpec,
    chosen_paths,
    delete_events,
    hello_path,
    measure_path,
    service_paths,
    start_hello,
    start_services,
)
from flashcoupon_loadtest.benchkit import RESULTS, stop_all
from flashcoupon_loadtest.localrun import add_scheduling_option, apply_scheduling, stack_env

LAYERS = ("server", "application", "libraries")
# Where a frame's file lives, by its first path component as py-spy prints it.
_SERVER = ("uvicorn/", "httptools/", "uvloop/", "asyncio/", "flashcoupon_common/httpserver.py")
PATHS = ("hello", "issuer", "gateway", "crowd", "soldout")
SAMPLE_RATE = 200  # per second: enough for 1 % shares in 10 s of a busy process


def frame_key(frame: str) -> tuple[str, str]:
    """(function, file) of one py-spy frame, `function (file:line)`; the line is dropped so a
    function's samples add up wherever in it they were taken."""
    function, sep, where = frame.rpartition(" (")
    if not sep:
        return frame, ""
    return function, where.rstrip(")").rsplit(":", 1)[0]


def layer_of(file: str) -> str:
    if file.startswith(_SERVER):
        return "server"
    if file.startswith("flashcoupon"):
        return "application"
    return "libraries"


@dataclass(frozen=True)
class Profile:
    """Samples by the function they were taken in (`own`), by every function on the stack
    (`inclusive`, a recursive function counted once per sample) and by the layer of `own`."""

    samples: int
    own: Counter[str]
    inclusive: Counter[str]
    layers: Counter[str]

    def share(self, count: int) -> float:
        return count / self.samples if self.samples else 0.0


def summarize(folded: str) -> Profile:
    """A Profile of py-spy's raw output: one `frame;frame;...;frame count` line per stack,
    outermost frame first."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    layers: Counter[str] = Counter()
    samples = 0
    for line in folded.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        samples += n
        keys = [frame_key(f) for f in stack.split(";")]
        names = [f"{function} ({file})" for function, file in keys]
        own[names[-1]] += n
        layers[layer_of(keys[-1][1])] += n
        for name in set(names):
            inclusive[name] += n
    return Profile(samples, own, inclusive, layers)


def py_spy() -> str:
    """The py-spy installed with this package (a dependency: it is on PyPI as a wheel)."""
    return str(Path(sys.executable).parent / "py-spy")


def sampled(spec: PathSpec, process: str | None) -> PathSpec:
    """`spec`, measuring and sampling `process` (one it watches) instead of its server."""
    if process is None or process == spec.process:
        return spec
    if process not in spec.watch:
        watched = ", ".join(sorted(spec.watch))
        raise ValueError(f"the {spec.kind} path watches no process {process!r} ({watched})")
    return replace(spec, pid=spec.watch[process], process=process)


def profile_path(spec: PathSpec, *, seconds: int, users: int, concurrency: int) -> dict[str, Any]:
    """Rounds of `spec` back to back while py-spy samples its process for `seconds`."""
    events: list[str] = []
    drivers = driver.default_processes()
    try:
        measure_path(spec, users=min(users, 2000), concurrency=concurrency, drivers=drivers,
                     events=events)  # fmt: skip  # warm-up, not sampled
        with tempfile.NamedTemporaryFile(suffix=".txt") as raw:
            cmd = [py_spy(), "record", "--pid", str(spec.pid), "--duration", str(seconds),
                   "--rate", str(SAMPLE_RATE), "--nonblocking", "--format", "raw", "--output",
                   raw.name]  # fmt: skip
            sampler = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            rounds = []
            while sampler.poll() is None:
                rounds.append(
                    measure_path(
                        spec, users=users, concurrency=concurrency, drivers=drivers, events=events
                    )
                )
            _, err = sampler.communicate()
            if sampler.returncode != 0:
                raise RuntimeError(f"py-spy failed ({sampler.returncode}): {err.decode()[-500:]}")
            profile = summarize(Path(raw.name).read_text())
    finally:
        asyncio.run(delete_events(events))
    cpu_us = median(r["server_cpu_us_per_request"] for r in rounds)
    return {
        "process": spec.process,
        "rounds": len(rounds),
        "rps": median(r["rps"] for r in rounds),
        "cpu_us_per_request": cpu_us,
        "samples": profile.samples,
        "layers": {
            layer: {
                "share": round(profile.share(profile.layers[layer]), 3),
                "us_per_request": round(profile.share(profile.layers[layer]) * cpu_us, 1),
            }
            for layer in LAYERS
        },
        "own": _top(profile, profile.own),
        "inclusive": _top(profile, profile.inclusive),
    }


def _top(profile: Profile, counts: Counter[str], n: int = 40) -> list[tuple[str, float]]:
    return [(name, round(profile.share(c), 3)) for name, c in counts.most_common(n)]


def report_lines(results: Mapping[str, Mapping[str, Any]], top: int) -> list[str]:
    lines = ["path        CPU us/req   " + "".join(f"{layer:>22}" for layer in LAYERS)]
    for path, r in results.items():
        cells = "".join(
            f"{r['layers'][layer]['us_per_request']:>12.1f} us ({r['layers'][layer]['share']:.0%})"
            for layer in LAYERS
        )
        lines.append(f"{path:<11} {r['cpu_us_per_request']:>10.1f}   {cells}")
    for path, r in results.items():
        lines.append(f"\n{path} ({r['process']}, {r['samples']} samples): own time, top {top}")
        lines += [f"  {share:6.1%}  {name}" for name, share in r["own"][:top]]
        lines.append(f"{path}: inclusive, top {top}")
        lines += [f"  {share:6.1%}  {name}" for name, share in r["inclusive"][:top]]
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cpu_profile", description=__doc__.split("\n")[0])
    parser.add_argument("--paths", default="hello,issuer,gateway", help="comma-separated")
    parser.add_argument("--seconds", type=int, default=10, help="sampled per path (whole seconds)")
    parser.add_argument("--users", type=int, default=20_000, help="shoppers per round")
    parser.add_argument("--concurrency", type=int, default=64, help="driver connections")
    parser.add_argument("--top", type=int, default=20, help="functions listed per path")
    parser.add_argument(
        "--sample", help="the process to sample on every path (default: the path's server)"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "profile.json")
    add_scheduling_option(parser)
    args = parser.parse_args(argv)
    chosen = chosen_paths(parser, args.paths, PATHS)
    if args.seconds <= 0:
        parser.error("--seconds must be at least 1")

    apply_scheduling(args.scheduling)
    bin_dir = Path(sys.executable).parent
    procs = start_services(bin_dir, processes=1, env=stack_env(), tag="profile", unbatched=False)
    try:
        procs["hello"] = start_hello("profile")
        paths = {**service_paths(procs), "hello": hello_path(procs["hello"])}
        try:
            specs = {name: sampled(paths[name], args.sample) for name in chosen}
        except ValueError as exc:
            parser.error(str(exc))
        results = {}
        for name, spec in specs.items():
            print(f"[profile] {name}: sampling {spec.process} for {args.seconds:g} s", flush=True)
            results[name] = profile_path(
                spec, seconds=args.seconds, users=args.users, concurrency=args.concurrency
            )
    finally:
        stop_all(p.proc for p in procs.values())
    print("\n".join(report_lines(results, args.top)))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    report = {"benchmark": "profile", "settings": settings, "paths": results}
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwritten {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
