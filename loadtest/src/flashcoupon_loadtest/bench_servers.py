"""`make bench-servers`: uvicorn against granian, serving the gateway and issuer apps, same run.

    uv run python -m flashcoupon_loadtest.bench_servers [--users 20000] [--rounds 2]

Issue 13, goal 4: which HTTP server should run the services. Each app is served twice, one
worker process each, started by flashcoupon_loadtest.serve:

  uvicorn  the services' own options (uvloop, the guarded httptools protocol, no access log)
  granian  granian's ASGI interface, uvloop, HTTP/1, one worker, no access log, the same
           header read deadline (it has no body deadline: one thing uvicorn's guard adds)

Paths: hello-world (the same JWT presses as the gateway gets), the issuer app direct on a fresh
event, and the gateway app forwarding issues — both gateways to the same uvicorn issuer, so
only the gateway's server differs. Rounds alternate; each path reports req/s and the CPU per
request of its server process tree (granian serves from a child process). Ratios:
granian/uvicorn per app. Writes loadtest/results/bench-servers.json.
"""

from __future__ import annotations

import argparse
import sys

from flashcoupon_loadtest import driver
from flashcoupon_loadtest.bench_gateway import Kind, PathSpec, Started, run_paths
from flashcoupon_loadtest.benchkit import HELLO_APP, publish, serve, stop_all
from flashcoupon_loadtest.localrun import free_port, stack_env
from flashcoupon_loadtest.rounds import DEFAULT_ROUNDS, Ratio
from flashcoupon_loadtest.serve import SERVERS, Server
from flashcoupon_loadtest.tokens import DEMO_SECRET

ISSUER_APP = "flashcoupon_issuer.__main__:build"
GATEWAY_APP = "flashcoupon_gateway.__main__:factory"
APPS: tuple[Kind, ...] = ("hello", "issuer", "gateway")
RATIOS = {f"{app} granian/uvicorn": Ratio(f"granian:{app}", f"uvicorn:{app}") for app in APPS} | {
    f"{server}: issuer/hello": Ratio(f"{server}:issuer", f"{server}:hello") for server in SERVERS
}


def _start(app: str, server: Server, env: dict[str, str], factory: bool = True) -> Started:
    port = free_port()
    name = app.split(".")[0].removeprefix("flashcoupon_")
    service = name if name in ("issuer", "gateway") else "hello"
    proc = serve(
        app, port, env, f"bench-servers-{server}-{name}.log", factory, server=server,
        service=service,
    )  # fmt: skip
    return Started(proc, f"http://127.0.0.1:{port}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench_servers", description=__doc__.split("\n")[0])
    ap.add_argument("--users", type=int, default=20_000, help="requests per path per round")
    ap.add_argument(
        "--rounds", type=int, default=DEFAULT_ROUNDS, help="rounds per path, alternating"
    )
    ap.add_argument("--concurrency", type=int, default=64, help="driver connections")
    ap.add_argument("--drivers", type=int, default=driver.default_processes())
    args = ap.parse_args(argv)

    env = stack_env()
    started: dict[str, Started] = {}
    try:
        # The one upstream both gateways forward to: a uvicorn issuer, as deployed today.
        upstream = _start(ISSUER_APP, "uvicorn", env)
        started["upstream issuer"] = upstream
        gateway_env = {
            **env,
            "FLASHCOUPON_GATEWAY_JWT_SECRET": DEMO_SECRET,
            "FLASHCOUPON_GATEWAY_ISSUER_URLS": upstream.url,
            "FLASHCOUPON_GATEWAY_IP_PER_SECOND": "1000000",
            "FLASHCOUPON_GATEWAY_IP_BURST": "1000000",
        }
        paths: dict[str, PathSpec] = {}
        for server in SERVERS:
            started[f"{server}:hello"] = _start(HELLO_APP, server, {}, factory=False)
            started[f"{server}:issuer"] = _start(ISSUER_APP, server, env)
            started[f"{server}:gateway"] = _start(GATEWAY_APP, server, gateway_env)
            for app in APPS:
                s = started[f"{server}:{app}"]
                watch: dict[str, int] = {app: s.proc.pid}
                if app == "gateway":
                    watch["upstream issuer"] = upstream.proc.pid
                paths[f"{server}:{app}"] = PathSpec(app, s.url, s.proc.pid, app, watch)
        rounds = run_paths(
            paths,
            users=args.users,
            rounds=args.rounds,
            concurrency=args.concurrency,
            drivers=args.drivers,
            tag="bench-servers",
        )
    finally:
        stop_all(s.proc for s in started.values())

    publish("servers", args, rounds, RATIOS, {name: p.process for name, p in paths.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
