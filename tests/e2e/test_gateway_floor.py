"""The gateway's floor (`make bench-gateway`'s floor path) in front of a real issuer process:
its presses go through the gateway's own batcher and pool, so the issuer answers them as it
answers the gateway's (a coupon, a keyed replay, DUPLICATE)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from flashcoupon_common import keys
from flashcoupon_common.coupon_math import coupon_code
from flashcoupon_loadtest.gateway_floor import GatewayFloor

from tests.support import asgi
from tests.support.floors import asgi_presses
from tests.support.gateway import SECRET, bearer, provision
from tests.support.processes import issuer_proc
from tests.support.raw_http import exchange, serving
from tests.support.stack import Stack


async def test_the_floor_relays_the_issuers_answers(
    stack: Stack, redis_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = await provision(redis_cluster, quantity=2)
    secret = (await redis_cluster.hget(keys.config_key(spec.event_id), "secret")).decode()
    issuer = issuer_proc(stack).start()
    for name, value in {
        **stack.env(),
        "FLASHCOUPON_GATEWAY_JWT_SECRET": SECRET,
        "FLASHCOUPON_GATEWAY_ISSUER_URLS": issuer.url,
    }.items():
        monkeypatch.setenv(name, value)
    path = f"/v1/events/{spec.event_id}/issue"
    token = bearer("bob")["Authorization"]

    def raw(key: str) -> bytes:
        return (
            f"POST {path} HTTP/1.1\r\nHost: t\r\nAuthorization: {token}\r\n"
            f"Idempotency-Key: {key}\r\nConnection: close\r\n\r\n"
        ).encode()

    try:
        async with asgi.running(GatewayFloor()) as app, asgi.client(app) as http:
            first = await http.post(path, headers={**bearer("alice"), "Idempotency-Key": "k1"})
            replay = await http.post(path, headers={**bearer("alice"), "Idempotency-Key": "k1"})
            again = await http.post(path, headers={**bearer("alice"), "Idempotency-Key": "k2"})
            ready = await http.get("/readyz")
        # Under uvicorn the floor answers directly, once the issuer's answer is in: the same
        # answers (the second of its two coupons for bob, then DUPLICATE), no ASGI call.
        floor = GatewayFloor()
        asked = asgi_presses(floor)
        async with serving(floor) as (_, port):
            direct, duplicate = await exchange(port, raw("b1")), await exchange(port, raw("b2"))
    finally:
        issuer.stop()
    assert direct.startswith(b"HTTP/1.1 201") and b'"userId":"bob"' in direct
    assert duplicate.startswith(b"HTTP/1.1 409") and b'"DUPLICATE"' in duplicate
    assert asked == []
    assert first.status_code == 201, first.text
    coupon = orjson.loads(first.content)
    assert coupon["couponCode"] == coupon_code(secret, 0)
    assert (coupon["eventId"], coupon["userId"]) == (spec.event_id, "alice")
    assert first.headers["content-type"] == "application/json"
    assert replay.status_code == 201 and replay.headers["idempotent-replayed"] == "true"
    assert orjson.loads(replay.content)["couponCode"] == coupon["couponCode"]
    assert again.status_code == 409 and orjson.loads(again.content)["code"] == "DUPLICATE"
    assert ready.status_code == 200
