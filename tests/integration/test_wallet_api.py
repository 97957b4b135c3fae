"""The wallet API served by uvicorn against a fresh MariaDB database and a real Kafka topic."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import orjson
import uvicorn
from aiokafka import AIOKafkaConsumer
from flashcoupon_common.db.schema import coupon_events, user_coupons
from flashcoupon_common.messages import CouponRedeemed
from flashcoupon_common.settings import MysqlSettings
from flashcoupon_wallet.app import create_app
from flashcoupon_wallet.settings import WalletSettings
from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette

from tests.conftest import Stack, random_name

USER = "X-Flashcoupon-User"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def serve(app: Starlette) -> AsyncIterator[httpx.AsyncClient]:
    """Run the app under uvicorn (so its lifespan really runs) and give a client for it."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False)
    )
    task = asyncio.create_task(server.serve())
    for _ in range(200):
        if server.started:
            break
        await asyncio.sleep(0.05)
    assert server.started, "wallet did not start"
    limits = httpx.Limits(max_connections=200)
    try:
        async with httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", limits=limits, timeout=30
        ) as client:
            yield client
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)


def wallet_settings(stack: Stack, mysql_url: str, topic: str, **over: Any) -> WalletSettings:
    return WalletSettings(
        mysql=MysqlSettings(mysql_url),
        kafka=over.pop("kafka", stack.kafka),
        redeemed_topic=topic,
        **over,
    )


async def add_event(engine: AsyncEngine, event_id: str) -> None:
    now = datetime.now(UTC).replace(tzinfo=None)
    async with engine.begin() as conn:
        await conn.execute(
            insert(coupon_events).values(
                id=event_id,
                title=event_id,
                quantity=100,
                per_user_limit=2,
                start_at=now - timedelta(hours=1),
                end_at=now + timedelta(hours=1),
                valid_for_seconds=86400,
                spec="{}",
            )
        )


async def add_coupon(
    engine: AsyncEngine,
    event_id: str,
    user_id: str,
    *,
    seq: int = 1,
    code: str | None = None,
    discount: dict[str, Any] | None = None,
    issued_ago: timedelta = timedelta(minutes=5),
    expires_in: timedelta = timedelta(days=30),
) -> str:
    code = code or random_name("c").replace("-", "").upper()
    now = datetime.now(UTC).replace(tzinfo=None)
    d = discount or {"discount_type": "fixed", "amount": 10_000}
    async with engine.begin() as conn:
        await conn.execute(
            insert(user_coupons).values(
                event_id=event_id,
                user_id=user_id,
                seq=seq,
                code=code,
                tier="big",
                issued_at=now - issued_ago,
                expires_at=now + expires_in,
                request_id=random_name("r"),
                **d,
            )
        )
    return code


async def consume_all(stack: Stack, topic: str, want: int, wait_s: float = 20) -> list[bytes]:
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=stack.kafka.bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        group_id=None,
    )
    await consumer.start()
    got: list[bytes] = []
    try:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while len(got) < want and loop.time() < deadline:
            batches = await consumer.getmany(timeout_ms=500)
            got += [m.value for msgs in batches.values() for m in msgs if m.value is not None]
        # a little longer, so a duplicate would be seen too
        batches = await consumer.getmany(timeout_ms=1000)
        got += [m.value for msgs in batches.values() for m in msgs if m.value is not None]
    finally:
        await consumer.stop()
    return got


def is_problem(r: httpx.Response, status: int, code: str) -> bool:
    return (
        r.status_code == status
        and r.headers["content-type"] == "application/problem+json"
        and r.json()["code"] == code
        and bool(r.json()["detail"])
    )


async def test_one_of_100_concurrent_redemptions_wins_and_replay_is_idempotent(
    stack: Stack, mysql_url: str, mysql_engine: AsyncEngine, kafka_topic: str
) -> None:
    event = random_name("ev")
    await add_event(mysql_engine, event)
    code = await add_coupon(mysql_engine, event, "alice")
    app = create_app(wallet_settings(stack, mysql_url, kafka_topic))
    async with serve(app) as c:

        async def attempt(i: int) -> httpx.Response:
            return await c.post(
                f"/v1/coupons/{code}/redeem",
                json={"orderId": f"order-{i}", "orderAmount": 50_000},
                headers={USER: "alice"},
            )

        answers: Sequence[httpx.Response] = await asyncio.gather(*(attempt(i) for i in range(100)))
        statuses = sorted(r.status_code for r in answers)
        assert statuses == [200] + [409] * 99, statuses
        winner = next(r for r in answers if r.status_code == 200).json()
        assert all(is_problem(r, 409, "ALREADY_REDEEMED") for r in answers if r.status_code != 200)
        assert winner["couponCode"] == code
        assert (winner["orderAmount"], winner["discountAmount"], winner["payAmount"]) == (
            50_000,
            10_000,
            40_000,
        )

        replay = await c.post(
            f"/v1/coupons/{code}/redeem",
            json={"orderId": winner["orderId"], "orderAmount": 50_000},
            headers={USER: "alice"},
        )
        assert replay.status_code == 200 and replay.json() == winner
        assert replay.headers["idempotent-replayed"] == "true"

        stranger = await c.post(
            f"/v1/coupons/{code}/redeem",
            json={"orderId": winner["orderId"], "orderAmount": 50_000},
            headers={USER: "mallory"},
        )
        assert is_problem(stranger, 403, "NOT_YOUR_COUPON")

    async with mysql_engine.connect() as conn:
        row = (
            (await conn.execute(select(user_coupons).where(user_coupons.c.code == code)))
            .one()
            ._mapping
        )
    assert (row["status"], row["order_id"], row["discount_amount"]) == (
        "redeemed",
        winner["orderId"],
        10_000,
    )

    # exactly one coupon-redeemed event: the winner's (replays publish nothing)
    values = await consume_all(stack, kafka_topic, want=1)
    events = [CouponRedeemed.decode(v) for v in values]
    assert [(e.code, e.order_id, e.user_id, e.event_id) for e in events] == [
        (code, winner["orderId"], "alice", event)
    ]
    assert events[0].discount_amount == 10_000


async def test_refusals_are_problem_json_never_500(
    stack: Stack, mysql_url: str, mysql_engine: AsyncEngine, kafka_topic: str
) -> None:
    event = random_name("ev")
    await add_event(mysql_engine, event)
    code = await add_coupon(mysql_engine, event, "alice")
    lapsed = await add_coupon(mysql_engine, event, "alice", seq=2, expires_in=timedelta(seconds=-1))
    app = create_app(wallet_settings(stack, mysql_url, kafka_topic, max_body_bytes=256))
    good = {"orderId": "o-1", "orderAmount": 1000}
    alice = {USER: "alice"}
    async with serve(app) as c:
        url = f"/v1/coupons/{code}/redeem"
        assert is_problem(await c.post(url, json=good), 401, "UNAUTHORIZED")
        r = await c.post(url, json=good, headers={USER: "u" * 200})
        assert is_problem(r, 400, "INVALID_USER")
        r = await c.post("/v1/coupons/NOSUCHCODE/redeem", json=good, headers=alice)
        assert is_problem(r, 404, "COUPON_NOT_FOUND")
        r = await c.post(f"/v1/coupons/{'X' * 40}/redeem", json=good, headers=alice)
        assert is_problem(r, 400, "INVALID_COUPON_CODE")
        r = await c.post(f"/v1/coupons/{lapsed}/redeem", json=good, headers=alice)
        assert is_problem(r, 410, "EXPIRED")
        r = await c.post(url, json=good, headers={USER: "bob"})
        assert is_problem(r, 403, "NOT_YOUR_COUPON")

        bad_bodies: list[tuple[bytes, int, str]] = [
            (b"", 400, "MALFORMED_JSON"),
            (b"{not json", 400, "MALFORMED_JSON"),
            (b"[1, 2]", 400, "MALFORMED_JSON"),
            (b"{}", 422, "INVALID_REQUEST"),
            (b'{"orderId": 5, "orderAmount": 10}', 422, "INVALID_REQUEST"),
            (b'{"orderId": "o", "orderAmount": "10"}', 422, "INVALID_REQUEST"),
            (b'{"orderId": "o", "orderAmount": -1}', 422, "INVALID_REQUEST"),
            (b'{"orderId": "o", "orderAmount": 1.5}', 422, "INVALID_REQUEST"),
            (b'{"orderId": "o", "orderAmount": 0}', 422, "INVALID_REQUEST"),
            (b'{"orderId": "a\\u0000b", "orderAmount": 10}', 422, "INVALID_REQUEST"),
            (b'{"orderId": "a\\nb", "orderAmount": 10}', 422, "INVALID_REQUEST"),
            (b'{"orderId": "o", "orderAmount": 99999999999999999999999}', 422, "INVALID_REQUEST"),
            (orjson.dumps({"orderId": "o" * 65, "orderAmount": 1}), 422, "INVALID_REQUEST"),
            (
                orjson.dumps({"orderId": "o", "orderAmount": 1, "pad": "x" * 300}),
                413,
                "PAYLOAD_TOO_LARGE",
            ),
        ]
        for raw, status, problem_code in bad_bodies:
            r = await c.post(url, content=raw, headers=alice)
            assert is_problem(r, status, problem_code), (raw[:40], r.status_code, r.text)
        # none of the bad requests touched the coupon: it still redeems
        r = await c.post(url, json=good, headers=alice)
        assert r.status_code == 200 and r.json()["discountAmount"] == 1000  # capped at the order
        r = await c.get(f"/v1/coupons/{code}/redeem", headers=alice)
        assert is_problem(r, 405, "METHOD_NOT_ALLOWED")


async def test_my_coupons_newest_first_and_event_counts(
    stack: Stack, mysql_url: str, mysql_engine: AsyncEngine, kafka_topic: str
) -> None:
    ev1, ev2, empty = random_name("ev"), random_name("ev"), random_name("ev")
    for ev in (ev1, ev2, empty):
        await add_event(mysql_engine, ev)
    old = await add_coupon(mysql_engine, ev1, "alice", issued_ago=timedelta(hours=2))
    pct = {"discount_type": "percent", "percent": 5, "max_amount": 3000}
    new = await add_coupon(mysql_engine, ev2, "alice", discount=pct)
    gone = await add_coupon(
        mysql_engine,
        ev2,
        "alice",
        seq=2,
        issued_ago=timedelta(hours=3),
        expires_in=timedelta(minutes=-1),
    )
    await add_coupon(mysql_engine, ev1, "bob")
    app = create_app(wallet_settings(stack, mysql_url, kafka_topic))
    async with serve(app) as c:
        r = await c.post(
            f"/v1/coupons/{new}/redeem",
            json={"orderId": "o-9", "orderAmount": 200_000},
            headers={USER: "alice"},
        )
        assert r.status_code == 200 and r.json()["discountAmount"] == 3000  # 5 % capped

        r = await c.get("/v1/me/coupons", headers={USER: "alice"})
        assert r.status_code == 200
        coupons = r.json()["coupons"]
        assert [x["couponCode"] for x in coupons] == [new, old, gone]
        assert [x["status"] for x in coupons] == ["redeemed", "issued", "expired"]
        assert coupons[0]["discount"] == {"type": "percent", "percent": 5, "maxAmount": 3000}
        assert coupons[0]["orderId"] == "o-9" and coupons[0]["eventId"] == ev2
        assert coupons[1]["expiresAt"].endswith("Z")
        r = await c.get("/v1/me/coupons?limit=1", headers={USER: "alice"})
        assert [x["couponCode"] for x in r.json()["coupons"]] == [new]
        assert (await c.get("/v1/me/coupons", headers={USER: "nobody"})).json()["coupons"] == []
        assert is_problem(await c.get("/v1/me/coupons"), 401, "UNAUTHORIZED")
        r = await c.get("/v1/me/coupons?limit=0", headers={USER: "alice"})
        assert is_problem(r, 400, "INVALID_LIMIT")

        r = await c.get(f"/v1/events/{ev2}/persisted")
        assert r.json() == {"eventId": ev2, "persisted": 2, "redeemed": 1}
        r = await c.get(f"/v1/events/{empty}/persisted")
        assert r.json() == {"eventId": empty, "persisted": 0, "redeemed": 0}
        assert is_problem(await c.get("/v1/events/nope-x/persisted"), 404, "EVENT_NOT_FOUND")
        assert is_problem(await c.get("/v1/events/Bad_Id/persisted"), 400, "INVALID_EVENT_ID")

        assert (await c.get("/healthz")).status_code == 200
        r = await c.get("/readyz")
        assert r.status_code == 200 and r.json()["checks"] == {"mysql": True}
        metrics = (await c.get("/metrics")).text
        assert 'route="/v1/coupons/{code}/redeem"' in metrics


async def test_database_unreachable_is_503_not_500(stack: Stack, kafka_topic: str) -> None:
    # A port nothing listens on: MySQL is really unreachable, not simulated.
    dead = f"mysql+asyncmy://flashcoupon:flashcoupon@127.0.0.1:{free_port()}/flashcoupon"
    app = create_app(wallet_settings(stack, dead, kafka_topic))
    async with serve(app) as c:
        r = await c.get("/v1/me/coupons", headers={USER: "alice"})
        assert is_problem(r, 503, "DB_UNAVAILABLE") and r.headers["retry-after"] == "1"
        r = await c.post(
            "/v1/coupons/ABC/redeem",
            json={"orderId": "o-1", "orderAmount": 10},
            headers={USER: "alice"},
        )
        assert is_problem(r, 503, "DB_UNAVAILABLE")
        r = await c.get("/readyz")
        assert r.status_code == 503
        assert (await c.get("/healthz")).status_code == 200


async def test_concurrent_retries_of_one_order_all_get_the_same_answer(
    stack: Stack, mysql_url: str, mysql_engine: AsyncEngine, kafka_topic: str
) -> None:
    # A client that times out and retries hard: 50 copies of the same request at once.
    event = random_name("ev")
    await add_event(mysql_engine, event)
    code = await add_coupon(mysql_engine, event, "alice")
    app = create_app(wallet_settings(stack, mysql_url, kafka_topic))
    async with serve(app) as c:
        answers = await asyncio.gather(
            *(
                c.post(
                    f"/v1/coupons/{code}/redeem",
                    json={"orderId": "same-order", "orderAmount": 12_345},
                    headers={USER: "alice"},
                )
                for _ in range(50)
            )
        )
    assert {r.status_code for r in answers} == {200}
    assert len({r.content for r in answers}) == 1
    assert sum(r.headers.get("idempotent-replayed") != "true" for r in answers) == 1
    values = await consume_all(stack, kafka_topic, want=1)
    assert [CouponRedeemed.decode(v).order_id for v in values] == ["same-order"]
