"""The gateway as a process in front of the real issuer process: auth, forwarding, bad input,
the waiting room's SSE stream. Helpers here are shared by the other gateway e2e files."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import jwt
import orjson
import pytest
from flashcoupon_common import event_state
from flashcoupon_common.event_spec import AdmissionSpec, EventSpec, TierSpec
from flashcoupon_common.messages import Discount

from tests.conftest import Stack, random_name

BIN = Path(sys.executable).parent
SECRET = "e2e-gateway-secret-" + os.urandom(12).hex()
AUD = "flashcoupon"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def token(user: str, *, secret: str = SECRET, aud: str = AUD, ttl: int = 600) -> str:
    now = int(time.time())
    claims = {"sub": user, "aud": aud, "iat": now, "exp": now + ttl}
    return jwt.encode(claims, secret, algorithm="HS256")


def bearer(user: str, **kw: Any) -> dict[str, str]:
    return {"Authorization": "Bearer " + token(user, **kw)}


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
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"{self.argv[0]} exited:\n{self.output()}"
            try:
                if httpx.get(self.url + "/readyz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"{self.argv[0]} did not become ready:\n{self.output()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def output(self) -> str:
        return Path(self.log.name).read_text(errors="replace")[-3000:]


def issuer_proc(stack: Stack, port: int | None = None) -> Proc:
    return Proc([str(BIN / "flashcoupon-issuer")], stack.env(), port or free_port())


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


async def provision(redis: Any, *, quantity: int = 1000, start_in: float = -5, **admission: Any):
    now = datetime.now(UTC)
    spec = EventSpec(
        event_id=random_name("gw"),
        title="gateway e2e",
        quantity=quantity,
        start_at=now + timedelta(seconds=start_in),
        end_at=now + timedelta(hours=1),
        tiers=(TierSpec("all", Discount("fixed", amount=1000), 100),),
        admission=AdmissionSpec(**admission),
    )
    await event_state.provision(redis, spec)
    return spec


@pytest.fixture(scope="module")
def issuer(stack: Stack) -> Iterator[Proc]:
    p = issuer_proc(stack).start()
    yield p
    p.stop()


@pytest.fixture(scope="module")
def gateway(stack: Stack, issuer: Proc) -> Iterator[Proc]:
    p = gateway_proc(stack, issuer.url).start()
    yield p
    p.stop()


@pytest.fixture
async def client(gateway: Proc) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=gateway.url, timeout=10) as c:
        yield c


def assert_problem(r: httpx.Response, status: int, code: str | None = None) -> None:
    assert r.status_code == status, (r.status_code, r.text)
    assert r.headers["content-type"] == "application/problem+json"
    if code is not None:
        assert r.json()["code"] == code, r.text


async def test_issue_uses_the_token_user_and_ignores_a_spoofed_header(
    client: httpx.AsyncClient, redis_cluster: Any
) -> None:
    spec = await provision(redis_cluster)
    headers = {**bearer("alice"), "X-Flashcoupon-User": "mallory"}
    r = await client.post(f"/v1/events/{spec.event_id}/issue", headers=headers)
    assert r.status_code == 201, r.text
    assert r.json()["userId"] == "alice" and r.json()["couponCode"]
    assert {"ratelimit-limit", "ratelimit-remaining", "ratelimit-reset"} <= set(r.headers)
    # The spoofed name got nothing: mallory can still get her own coupon, alice cannot again.
    again = await client.post(f"/v1/events/{spec.event_id}/issue", headers=headers)
    assert_problem(again, 409, "DUPLICATE")
    r = await client.post(f"/v1/events/{spec.event_id}/issue", headers=bearer("mallory"))
    assert r.status_code == 201 and r.json()["userId"] == "mallory"
    state = await client.get(f"/v1/events/{spec.event_id}")
    assert state.status_code == 200 and state.json()["phase"] in ("Active", "active")


async def test_bad_tokens_are_401_with_www_authenticate(client: httpx.AsyncClient) -> None:
    path = "/v1/events/some-event/issue"
    bad = {
        "missing": {},
        "forged": bearer("alice", secret="not-the-gateway-secret-0123456789abcdef"),
        "expired": bearer("alice", ttl=-60),
        "wrong audience": bearer("alice", aud="another-service"),
        "garbage": {"Authorization": "Bearer abc.def.ghi"},
        "basic": {"Authorization": "Basic YWxpY2U6cHc="},
    }
    for name, headers in bad.items():
        r = await client.post(path, headers={**headers, "X-Flashcoupon-User": "alice"})
        assert_problem(r, 401, "UNAUTHORIZED")
        assert r.headers["www-authenticate"].startswith("Bearer"), name
    for method, p in [("GET", "/v1/me/coupons"), ("GET", "/v1/events/x/queue/1.2.3")]:
        assert_problem(await client.request(method, p), 401, "UNAUTHORIZED")


async def test_bad_input_is_4xx_problem_never_5xx(client: httpx.AsyncClient) -> None:
    auth = bearer("bob")
    cases = [
        ("POST", "/v1/events/ev/issue", {"content": b"{" * 10_000}, 413),
        ("POST", "/v1/events/ev/issue", {"content": b"{not json"}, 400),
        ("POST", "/v1/events/ev/issue", {"content": b"[1, 2]"}, 400),
        ("POST", "/v1/events/Not_An_Id/issue", {}, 400),
        ("POST", "/v1/events/ev/issue", {"headers": {"Idempotency-Key": "a b,c"}}, 400),
        ("POST", "/v1/coupons/ABC/redeem", {"content": b"nope"}, 400),
        ("POST", "/v1/coupons/ABC/redeem", {"json": {"orderId": 5}}, 422),
        ("POST", "/v1/coupons/ABC/redeem", {"json": {"orderId": "o", "orderAmount": "x"}}, 422),
        ("POST", "/v1/coupons/ABC/redeem", {"content": b'{"a":"' + b"x" * 9000 + b'"}'}, 413),
        ("POST", "/v1/coupons/bad%20code/redeem", {"json": {}}, 400),
        ("GET", "/v1/events/ev/queue/forged.1.x", {}, 404),
        ("GET", "/no/such/route", {}, 404),
        ("DELETE", "/v1/events/ev/issue", {}, 405),
    ]
    for method, path, kw, status in cases:
        headers = {**auth, **kw.pop("headers", {})}
        r = await client.request(method, path, headers=headers, **kw)
        assert_problem(r, status)
        assert r.json()["detail"], (method, path)
    # The server still answers normally afterwards.
    assert (await client.get("/healthz")).status_code == 200


async def test_openapi_is_served_and_matches_the_committed_copy(client: httpx.AsyncClient) -> None:
    served = (await client.get("/openapi.json")).json()
    committed = orjson.loads((Path(__file__).parents[2] / "docs" / "openapi.json").read_bytes())
    assert served == committed
    assert served["openapi"].startswith("3.1")


async def test_waiting_room_sse_counts_down_then_issues(
    client: httpx.AsyncClient, redis_cluster: Any
) -> None:
    spec = await provision(
        redis_cluster, waiting_room_enabled=True, waiting_room_admit_per_second=5
    )
    eid = spec.event_id
    users = [f"sse-{i}" for i in range(12)]
    answers = await asyncio.gather(
        *(client.post(f"/v1/events/{eid}/issue", headers=bearer(u)) for u in users)
    )
    queued = {u: r.json() for u, r in zip(users, answers, strict=True) if r.status_code == 202}
    assert len(queued) >= 8, [r.status_code for r in answers]
    assert all(r.status_code in (201, 202) for r in answers)
    last_user = max(queued, key=lambda u: queued[u]["position"])
    q = queued[last_user]
    assert q["etaSeconds"] >= 1 and q["statusUrl"].endswith(q["ticket"])
    # The ticket is bound to its shopper.
    other = await client.get(q["statusUrl"], headers=bearer("someone-else"))
    assert_problem(other, 404, "TICKET_NOT_FOUND")
    status = await client.get(q["statusUrl"], headers=bearer(last_user))
    assert status.json()["state"] == "queued" and status.json()["position"] >= 1

    events: list[tuple[str, Any]] = []
    headers = {**bearer(last_user), "Accept": "text/event-stream"}
    async with client.stream("GET", q["statusUrl"], headers=headers) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        name = None
        async for line in r.aiter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                events.append((name, orjson.loads(line[6:])))
    kinds = [k for k, _ in events]
    assert kinds[-2:] == ["admitted", "result"], kinds
    positions = [d["position"] for k, d in events if k == "position"]
    assert len(positions) >= 2 and positions == sorted(positions, reverse=True), positions
    result = events[-1][1]
    assert result["status"] == 201 and result["body"]["userId"] == last_user
    # The admission was used: the ticket is gone, and a second issue is a DUPLICATE.
    after = await client.get(q["statusUrl"], headers=bearer(last_user))
    assert after.json()["state"] == "gone"
    dup = await client.post(f"/v1/events/{eid}/issue", headers=bearer(last_user))
    assert dup.status_code in (202, 409)

    # Without SSE: poll the JSON status until admitted, then press again to get the coupon.
    first_user = min(queued, key=lambda u: queued[u]["position"])
    url = queued[first_user]["statusUrl"]
    for _ in range(100):
        state = (await client.get(url, headers=bearer(first_user))).json()
        if state["state"] != "queued":
            break
        await asyncio.sleep(0.1)
    assert state["state"] == "admitted" and state["position"] == 0, state
    r = await client.post(f"/v1/events/{eid}/issue", headers=bearer(first_user))
    assert r.status_code == 201 and r.json()["userId"] == first_user


async def test_sold_out_is_answered_by_the_gateway_but_keyed_retries_reach_the_issuer(
    client: httpx.AsyncClient, issuer: Proc, redis_cluster: Any
) -> None:
    spec = await provision(redis_cluster, quantity=2)
    path = f"/v1/events/{spec.event_id}/issue"
    first = await client.post(path, headers={**bearer("so-1"), "Idempotency-Key": "so-1-k"})
    assert first.status_code == 201
    assert (await client.post(path, headers=bearer("so-2"))).status_code == 201
    assert_problem(await client.post(path, headers=bearer("so-3")), 410, "SOLD_OUT")
    # The sell-out reaches the gateway asynchronously (pub/sub, usually within tens of ms),
    # and its next read of the event (SPEC_CACHE_SECONDS, 1 s) says so too: past both.
    await asyncio.sleep(1.1)

    def issuer_410s(text: str) -> float:
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("flashcoupon_http_requests_total{")
            and "issue" in line
            and 'status="410"' in line
        )

    before = issuer_410s((await client.get(issuer.url + "/metrics")).text)
    for i in range(5):
        assert_problem(await client.post(path, headers=bearer(f"late-{i}")), 410, "SOLD_OUT")
    # Answered by the gateway: the issuer saw none of them.
    assert issuer_410s((await client.get(issuer.url + "/metrics")).text) == before
    # A retry with the same Idempotency-Key gets its coupon back, sold out or not.
    retry = await client.post(path, headers={**bearer("so-1"), "Idempotency-Key": "so-1-k"})
    assert retry.status_code == 201, retry.text
    assert retry.json()["couponCode"] == first.json()["couponCode"]
