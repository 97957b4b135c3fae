"""Service processes for the e2e tests (and benchmarks): start, wait for /readyz, stop.

Built on flashcoupon_loadtest.localrun, the way `make demo` runs the services: the same free
port picking and the same readiness wait (`localrun.wait_ready`, which fails early when the
process exits). What the tests add: a log per process read back on failure, SIGKILL for crash
drills, and launchers per service with the settings the tests need.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from flashcoupon_loadtest import localrun

from tests.support.gateway import SECRET
from tests.support.paths import BIN, ROOT
from tests.support.ports import free_port
from tests.support.stack import Stack

READY_TIMEOUT_S = 30.0


def ready_or_fail(
    url: str, proc: subprocess.Popen[Any], timeout: float, output: Callable[[], str] = str
) -> None:
    """localrun's readiness wait, failing the test (AssertionError) with what the process said."""
    try:
        localrun.wait_ready(f"{url}/readyz", timeout=timeout, proc=proc)
    except (RuntimeError, TimeoutError) as exc:
        raise AssertionError(f"{url}: {exc}\n{output()}") from None


class Proc:
    """A service process on a free port, its output in a temp file (read on failure)."""

    def __init__(self, argv: list[str], env: dict[str, str], port: int) -> None:
        self.argv, self.env, self.port = argv, env, port
        self.url = f"http://127.0.0.1:{port}"
        # Kept open for the process's lifetime (its stdout/stderr); read back on failure.
        self.log = tempfile.NamedTemporaryFile(  # noqa: SIM115
            prefix="fc-e2e-", suffix=".log", delete=False
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        self.proc = subprocess.Popen(
            [*self.argv, "--port", str(self.port)], env=self.env, stdout=self.log, stderr=self.log
        )
        ready_or_fail(self.url, self.proc, READY_TIMEOUT_S, self.output)
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill(self) -> None:
        """SIGKILL, as a crash would: no shutdown handlers run."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")[-3000:]


def issuer_proc(stack: Stack, port: int | None = None, **env: str) -> Proc:
    full = {**stack.env(), **{"FLASHCOUPON_ISSUER_" + k.upper(): v for k, v in env.items()}}
    return Proc([str(BIN / "flashcoupon-issuer")], full, port or free_port())


def wallet_proc(stack: Stack, mysql_url: str, redeemed_topic: str) -> Proc:
    """The wallet on a test's own database and coupon-redeemed topic."""
    env = {
        **stack.env(),
        "FLASHCOUPON_MYSQL_URL": mysql_url,
        "FLASHCOUPON_WALLET_REDEEMED_TOPIC": redeemed_topic,
    }
    return Proc([str(BIN / "flashcoupon-wallet")], env, free_port())


def gateway_proc(stack: Stack, issuer_urls: str, **env: str) -> Proc:
    full = {
        **stack.env(),
        "FLASHCOUPON_GATEWAY_JWT_SECRET": SECRET,
        "FLASHCOUPON_GATEWAY_ISSUER_URLS": issuer_urls,
        "FLASHCOUPON_GATEWAY_IP_PER_SECOND": "100000",
        "FLASHCOUPON_GATEWAY_IP_BURST": "100000",
        "FLASHCOUPON_GATEWAY_SSE_INTERVAL_SECONDS": "0.1",
        **{"FLASHCOUPON_GATEWAY_" + k.upper(): v for k, v in env.items()},
    }
    return Proc([str(BIN / "flashcoupon-gateway")], full, free_port())


async def wait_ready(
    url: str, proc: subprocess.Popen[Any], wait_s: float = READY_TIMEOUT_S
) -> None:
    """Wait (off the event loop) until the process at `url` answers /readyz with 200."""
    await asyncio.to_thread(ready_or_fail, url, proc, wait_s)


def start_wallet(
    stack: Stack, mysql_url: str, topic: str, *, output: int = subprocess.PIPE, **env: str
) -> tuple[subprocess.Popen[bytes], str]:
    """`python -m flashcoupon_wallet` on a free port, against this database and
    topic (`env` adds or overrides variables); returns the process and its base URL."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "flashcoupon_wallet", "--port", str(port)],
        env={
            **stack.env(),
            "FLASHCOUPON_MYSQL_URL": mysql_url,
            "FLASHCOUPON_WALLET_REDEEMED_TOPIC": topic,
            **env,
        },
        stdout=output,
        stderr=output,
    )
    return proc, f"http://127.0.0.1:{port}"


def start_relay(
    env: dict[str, str], log: Path, **overrides: str
) -> tuple[subprocess.Popen[bytes], int]:
    """`python -m flashcoupon_relay` on a free port; `overrides` set FLASHCOUPON_RELAY_<KEY>."""
    port = free_port()
    relay_env = {**env, **{f"FLASHCOUPON_RELAY_{k.upper()}": v for k, v in overrides.items()}}
    with log.open("ab") as out:  # the child has its own copy of the descriptor
        proc = subprocess.Popen(
            [sys.executable, "-m", "flashcoupon_relay", "--port", str(port)],
            env=relay_env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return proc, port


class Persister:
    """`uv run flashcoupon-persister` in its own process group (uv + the Python child)."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.port = free_port()
        self.log = log.open("ab")
        self.proc = subprocess.Popen(
            ["uv", "run", "--frozen", "flashcoupon-persister", "--port", str(self.port)],
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    async def ready(self) -> bool:
        try:
            async with httpx.AsyncClient() as client:
                r = await client.get(f"http://127.0.0.1:{self.port}/readyz", timeout=2)
            return r.status_code == 200
        except httpx.HTTPError:
            return False

    def kill(self) -> None:
        # The whole group, as a node crash would: uv cannot forward SIGKILL to its child.
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self) -> int:
        self.proc.send_signal(signal.SIGTERM)  # uv forwards it to the persister, as kubelet's
        return self.proc.wait(30)

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.log.close()
