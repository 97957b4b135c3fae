"""The issuer app end to end in-process, against the real Redis Cluster.

The app's lifespan really runs (`running`), requests go through Starlette routing, the RED
middleware, the handler and the batcher. The 100k burst uses `asgi_post`, a minimal ASGI
client (httpx's per-request overhead would make the burst take minutes on a 2-core box);
the other tests use httpx.AsyncClient over ASGITransport (tests/support/asgi.py).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import orjson
import pytest
from flashcoupon_common import event_state, keys
from flashcoupon_common.messages import CouponIssued
from flashcoupon_issuer.app import create_app
from flashcoupon_issuer.settings import IssuerSettings
from prometheus_client import REGISTRY

from tests.support.asgi import client, running
from tests.support.issuer import ISSUE, asgi_post, make_spec
from tests.support.polling import wait_until


@pytest.fixture
async def events(redis_cluster) -> AsyncIterator[list[str]]:
    ids: list[str] = []
    yield ids
    for eid in ids:
        await event_state.delete_state(redis_cluster, eid)


async def provisioned(redis, events: list[str], quantity: int, **kw: Any) -> str:
    spec = make_spec(quantity, **kw)
    await event_state.provision(redis, spec)
    events.append(spec.event_id)
    return spec.event_id


def settings(stack, **kw: Any) -> IssuerSettings:
    return IssuerSettings(redis=stack.redis, **kw)


async def test_burst_100k_users_10k_coupons(stack, redis_cluster, events) -> None:
    eid = await provisioned(redis_cluster, events, 10_000)
    statuses: collections.Counter[int] = collections.Counter()
    issued: dict[str, dict[str, Any]] = {}
    async with running(create_app(settings(stack))) as app:

        async def shopper(i: int) -> None:
            status, body = await asgi_post(
                app, ISSUE.format(eid), {"X-Flashcoupon-User": f"user-{i}"}
            )
            statuses[status] += 1
            if status == 201:
                issued[f"user-{i}"] = body

        # Waves of 5,000 concurrent requests (an asyncio.Semaphore with 100k waiters is
        # quadratic in Python 3.11).
        for wave in range(0, 100_000, 5_000):
            await asyncio.gather(*(shopper(i) for i in range(wave, wave + 5_000)))
    assert statuses == {201: 10_000, 410: 90_000}
    assert len({b["couponCode"] for b in issued.values()}) == 10_000
    assert all(b["userId"] == u for u, b in issued.items())
    tiers = collections.Counter(b["tier"] for b in issued.values())
    assert tiers == {"big": 1_000, "small": 9_000}
    state = await event_state.read_state(redis_cluster, eid)
    assert state is not None and state.issued == 10_000 and state.remaining == 0
    held = {c.user_id: c async for c in event_state.iter_issued(redis_cluster, eid)}
    assert {u: c.code for u, c in held.items()} == {u: b["couponCode"] for u, b in issued.items()}
    # exactly one outbox entry per coupon, each decodable
    entries = await redis_cluster.xrange(keys.outbox_key(eid))
    decoded = [CouponIssued.from_outbox(f) for _, f in entries]
    assert sorted(d.code for d in decoded) == sorted(b["couponCode"] for b in issued.values())


@pytest.mark.parametrize(
    ("outbox_entry", "names"),
    [
        ("one-field", {CouponIssued.OUTBOX_FIELD}),
        ("fields", set(CouponIssued.LEGACY_OUTBOX_FIELDS)),
    ],
)
async def test_outbox_entry_shape_follows_the_setting(
    stack, redis_cluster, events, outbox_entry: str, names: set[str]
) -> None:
    # `fields` is for a rollout while relays that read only a field per value still run.
    eid = await provisioned(redis_cluster, events, 10)
    async with running(create_app(settings(stack, outbox_entry=outbox_entry))) as app:
        answers = await asyncio.gather(
            *(asgi_post(app, ISSUE.format(eid), {"X-Flashcoupon-User": f"u{i}"}) for i in range(4))
        )
    assert [status for status, _ in answers] == [201] * 4
    entries = await redis_cluster.xrange(keys.outbox_key(eid))
    assert [{k.decode() for k in fields} for _, fields in entries] == [names] * 4
    decoded = {CouponIssued.from_outbox(fields).code for _, fields in entries}
    assert decoded == {body["couponCode"] for _, body in answers}


async def test_one_user_many_concurrent_requests(stack, redis_cluster, events) -> None:
    single = await provisioned(redis_cluster, events, 100)
    triple = await provisioned(redis_cluster, events, 100, per_user_limit=3)
    async with running(create_app(settings(stack))) as app:
        for eid, expected in ((single, 1), (triple, 3)):
            results = await asyncio.gather(
                *(
                    asgi_post(app, ISSUE.format(eid), {"X-Flashcoupon-User": "eve"})
                    for _ in range(1000)
                )
            )
            codes = collections.Counter(s for s, _ in results)
            assert codes == {201: expected, 409: 1000 - expected}
            dup = next(b for s, b in results if s == 409)
            assert dup["code"] == "DUPLICATE" and len(dup["coupons"]) == expected
            assert {c["couponCode"] for c in dup["coupons"]} == {
                b["couponCode"] for s, b in results if s == 201
            }


async def test_idempotency_key_replays_the_original_coupon(stack, redis_cluster, events) -> None:
    eid = await provisioned(redis_cluster, events, 10)
    async with (
        running(create_app(settings(stack))) as app,
        client(app, "http://i") as http,
    ):
        h = {"X-Flashcoupon-User": "carol", "Idempotency-Key": "k-123"}
        first = await http.post(ISSUE.format(eid), headers=h)
        again = await http.post(ISSUE.format(eid), headers=h)
        assert first.status_code == again.status_code == 201
        assert again.json() == first.json()
        assert again.headers["idempotent-replayed"] == "true"
        other = await http.post(ISSUE.format(eid), headers={**h, "Idempotency-Key": "k-456"})
        assert other.status_code == 409 and other.json()["code"] == "DUPLICATE"
        assert other.json()["coupon"]["couponCode"] == first.json()["couponCode"]
    state = await event_state.read_state(redis_cluster, eid)
    assert state is not None and state.issued == 1


async def test_each_answer_has_its_status_and_code(stack, redis_cluster, events) -> None:
    early = await provisioned(
        redis_cluster, events, 5, start=timedelta(hours=1), end=timedelta(hours=2)
    )
    late = await provisioned(
        redis_cluster, events, 5, start=timedelta(hours=-2), end=timedelta(hours=-1)
    )
    paused = await provisioned(redis_cluster, events, 5)
    await event_state.set_paused(redis_cluster, paused, True)
    tiny = await provisioned(redis_cluster, events, 1)
    u = {"X-Flashcoupon-User": "dave"}
    async with (
        running(create_app(settings(stack))) as app,
        client(app, "http://i") as http,
    ):
        cases = [
            (ISSUE.format(early), u, 409, "NOT_STARTED"),
            (ISSUE.format(late), u, 409, "ENDED"),
            (ISSUE.format(paused), u, 423, "PAUSED"),
            (ISSUE.format("no-such-event-x1"), u, 404, "EVENT_NOT_FOUND"),
            (ISSUE.format(tiny), u, 201, None),
            (ISSUE.format(tiny), {"X-Flashcoupon-User": "erin"}, 410, "SOLD_OUT"),
            (ISSUE.format("Bad_Id"), u, 400, "INVALID_EVENT_ID"),
            (ISSUE.format(tiny), {}, 400, "MISSING_USER"),
            (ISSUE.format(tiny), {**u, "Idempotency-Key": "a,b"}, 400, "INVALID_IDEMPOTENCY_KEY"),
        ]
        for path, headers, status, code in cases:
            r = await http.post(path, headers=headers)
            assert r.status_code == status, (path, r.text)
            if code:
                assert r.headers["content-type"] == "application/problem+json"
                assert r.json()["code"] == code
        r = await http.get(f"/v1/events/{tiny}")
        assert r.status_code == 200
        assert r.json() | {"startAt": None, "endAt": None} == {
            "eventId": tiny,
            "phase": "SoldOut",
            "paused": False,
            "startAt": None,
            "endAt": None,
            "quantity": 1,
            "remaining": 0,
        }
        assert (await http.get("/v1/events/nope-none")).status_code == 404
        assert (await http.get("/readyz")).status_code == 200
        metrics = (await http.get("/metrics")).text
        assert (
            f'flashcoupon_issuer_issuance_total{{event="{tiny}",outcome="ISSUED"}} 1.0' in metrics
        )
        # the issue endpoint bypasses REDMiddleware but records the same RED series
        route = "/internal/v1/events/{eventId}/issue"
        assert (
            f'flashcoupon_http_requests_total{{method="POST",route="{route}",'
            'service="issuer",status="410"}' in metrics
        )


async def test_sold_out_answers_make_no_redis_call(stack, redis_cluster, events) -> None:
    eid = await provisioned(redis_cluster, events, 3)
    async with (
        running(create_app(settings(stack, sold_out_ttl_s=600))) as app,
        client(app, "http://i") as http,
    ):
        batcher = app.state["batcher"]
        calls = 0
        real_submit = batcher.submit_many

        def counting(*args: Any) -> Any:
            nonlocal calls
            calls += 1
            return real_submit(*args)

        batcher.submit_many = counting
        winners = []
        for i in range(3):  # the reply for the last coupon says remaining 0: learned there
            h = {"X-Flashcoupon-User": f"u{i}", "Idempotency-Key": f"k{i}"}
            r = await http.post(ISSUE.format(eid), headers=h)
            assert r.status_code == 201
            winners.append((h, r.json()))
        assert calls == 3
        # keyed requests are answered locally too: a new key gets SOLD_OUT, the retry of a
        # winning key gets its coupon back (this process remembers what it issued)
        r = await http.post(
            ISSUE.format(eid), headers={"X-Flashcoupon-User": "w", "Idempotency-Key": "kw"}
        )
        assert r.status_code == 410
        for h, body in winners:
            r = await http.post(ISSUE.format(eid), headers=h)
            assert r.status_code == 201 and r.json() == body
        assert calls == 3
        local_before = _sold_out_local(eid)
        for i in range(200):
            r = await http.post(ISSUE.format(eid), headers={"X-Flashcoupon-User": f"v{i}"})
            assert r.status_code == 410 and r.json()["code"] == "SOLD_OUT"
        assert calls == 3, "sold-out answers went to Redis"
        assert _sold_out_local(eid) - local_before == 200
        # A holder asking again without their key (their 201 never reached them, or they
        # press on another device) is told their coupon, not SOLD_OUT: holders go to Redis.
        for (h, body), key in zip(winners, (None, "another-key", None), strict=True):
            again = {"X-Flashcoupon-User": h["X-Flashcoupon-User"]}
            if key:
                again["Idempotency-Key"] = key
            r = await http.post(ISSUE.format(eid), headers=again)
            assert r.status_code == 409 and r.json()["code"] == "DUPLICATE", r.text
            assert r.json()["coupon"]["couponCode"] == body["couponCode"]
        assert calls == 6
        # Raising the supply publishes on the supply channel: the flag is forgotten at once
        # (the TTL is 10 minutes here, so only the pub/sub message can explain a 201).
        await event_state.provision(redis_cluster, make_spec(4, event_id=eid))
        for _ in range(100):
            r = await http.post(ISSUE.format(eid), headers={"X-Flashcoupon-User": "late"})
            if r.status_code == 201:
                break
            await asyncio.sleep(0.05)
        assert r.status_code == 201
        # Sold out again with a new holder: the holders are read afresh.
        r = await http.post(ISSUE.format(eid), headers={"X-Flashcoupon-User": "v0"})
        assert r.status_code == 410
        r = await http.post(ISSUE.format(eid), headers={"X-Flashcoupon-User": "late"})
        assert r.status_code == 409 and r.json()["code"] == "DUPLICATE", r.text


def _sold_out_local(eid: str) -> float:
    return (
        REGISTRY.get_sample_value("flashcoupon_issuer_sold_out_local_total", {"event": eid}) or 0.0
    )


async def test_paused_or_unknown_event_is_never_answered_sold_out(
    stack, redis_cluster, events
) -> None:
    """Issue 10 item 2: a paused event answered 423 once, then 410; an unknown id 404 then 410."""
    paused = await provisioned(redis_cluster, events, 100)
    await event_state.set_paused(redis_cluster, paused, True)
    unknown = "no-such-" + paused
    async with (
        running(create_app(settings(stack, sold_out_ttl_s=600))) as app,
        client(app, "http://i") as http,
    ):
        for i in range(3):
            r = await http.post(ISSUE.format(paused), headers={"X-Flashcoupon-User": f"p{i}"})
            assert r.status_code == 423 and r.json()["code"] == "PAUSED", r.text
            r = await http.post(ISSUE.format(unknown), headers={"X-Flashcoupon-User": f"p{i}"})
            assert r.status_code == 404 and r.json()["code"] == "EVENT_NOT_FOUND", r.text
        await event_state.set_paused(redis_cluster, paused, False)
        r = await http.post(ISSUE.format(paused), headers={"X-Flashcoupon-User": "after"})
        assert r.status_code == 201, r.text


async def test_presses_of_an_unknown_event_arriving_together_are_each_404(
    stack, redis_cluster, events
) -> None:
    """Presses that arrive together share one script call (the batcher merges them): each
    still gets 404 EVENT_NOT_FOUND, never a 503 (issue.lua once answered a merged call for an
    unknown event with the wrong number of replies)."""
    unknown = "no-such-" + await provisioned(redis_cluster, events, 1)
    async with (
        running(create_app(settings(stack))) as app,
        client(app, "http://i") as http,
    ):
        answers = await asyncio.gather(
            *(
                http.post(ISSUE.format(unknown), headers={"X-Flashcoupon-User": f"u{i}"})
                for i in range(40)
            )
        )
    assert collections.Counter(r.status_code for r in answers) == {404: 40}


def _series(name: str, label: str = "event") -> set[str]:
    return {
        s.labels[label]
        for metric in REGISTRY.collect()
        for s in metric.samples
        if s.name.startswith(name) and label in s.labels
    }


async def test_unknown_event_ids_add_no_series_and_no_cache_entries(
    stack, redis_cluster, events
) -> None:
    """Issue 10 item 3: any logged-in user could add a stock series and a sold-out flag per
    random event id. Only events that exist are labelled and cached; deleting one evicts it."""
    real = await provisioned(redis_cluster, events, 1)
    async with running(create_app(settings(stack, sold_out_ttl_s=600))) as app:
        service = app.state["service"]
        before = _series("flashcoupon_issuer_") | _series("flashcoupon_http_", "route")
        for i in range(200):
            status, _ = await asgi_post(
                app, ISSUE.format(f"random-{i}-{real}"), {"X-Flashcoupon-User": "mallory"}
            )
            assert status == 404
        after = _series("flashcoupon_issuer_") | _series("flashcoupon_http_", "route")
        # The real event's own series may appear meanwhile: its provisioning news can reach
        # this subscriber late, over the cluster bus from the node it was published on.
        assert after - before - {real} <= {"unknown"}, sorted(after - before)[:5]
        assert len(service.sold_out) == 0
        # A real event is labelled and, once sold out, cached ...
        assert (await asgi_post(app, ISSUE.format(real), {"X-Flashcoupon-User": "a"}))[0] == 201
        assert (await asgi_post(app, ISSUE.format(real), {"X-Flashcoupon-User": "b"}))[0] == 410
        assert real in _series("flashcoupon_issuer_stock_remaining")
        assert service.sold_out.known(real)
        # ... and deleting it evicts both (the delete is published to every issuer).
        await event_state.delete_state(redis_cluster, real)
        events.remove(real)
        await wait_until(
            lambda: (
                real not in _series("flashcoupon_issuer_stock_remaining")
                and not service.sold_out.known(real)
            ),
            10,
            0.05,
            what="the deleted event's series and sold-out flag gone",
        )
        status, body = await asgi_post(app, ISSUE.format(real), {"X-Flashcoupon-User": "c"})
        assert status == 404, body


async def test_a_batch_answers_each_press_as_it_would_be_answered_alone(
    stack, redis_cluster, events
) -> None:
    """POST /internal/v1/issue-batch (what the gateway sends): every press gets the status,
    headers and body of a lone request, in order; a batch that is not one is a 400."""
    from flashcoupon_common import issue_batch
    from flashcoupon_common.issue_batch import Press

    tiny = await provisioned(redis_cluster, events, 2)
    paused = await provisioned(redis_cluster, events, 5)
    await event_state.set_paused(redis_cluster, paused, True)
    async with (
        running(create_app(settings(stack))) as app,
        client(app, "http://i") as http,
    ):

        async def batch(presses: list[Press]) -> list[issue_batch.Answer]:
            r = await http.post(issue_batch.BATCH_PATH, content=issue_batch.encode_presses(presses))
            assert r.status_code == 200, r.text
            return issue_batch.decode_answers(r.content, len(presses))

        answers = await batch(
            [
                Press(tiny, "ann", "ann-k", None),
                Press(tiny, "bob", None, "00-" + "1" * 32 + "-" + "2" * 16 + "-01"),
                Press(tiny, "ann", "ann-k2", None),  # ann again, another key
                Press(paused, "ann", None, None),
                Press("Bad_Id", "ann", None, None),
                Press(tiny, "", None, None),
            ]
        )
        statuses = [a[0] for a in answers]
        assert statuses == [201, 201, 409, 423, 400, 400]
        bodies = [orjson.loads(a[2]) for a in answers]
        assert bodies[0]["userId"] == "ann" and bodies[1]["userId"] == "bob"
        assert bodies[2]["code"] == "DUPLICATE"
        assert bodies[2]["coupon"]["couponCode"] == bodies[0]["couponCode"]
        assert [b.get("code") for b in bodies[3:]] == ["PAUSED", "INVALID_EVENT_ID", "MISSING_USER"]
        headers = [dict(a[1]) for a in answers]
        assert headers[3][b"retry-after"] == b"5"
        assert headers[4][b"content-type"] == b"application/problem+json"
        assert all(b"content-length" not in h for h in headers)
        # Sent alone afterwards, each press gets what the batch said: ann's keyed replay...
        alone = await http.post(
            ISSUE.format(tiny), headers={"X-Flashcoupon-User": "ann", "Idempotency-Key": "ann-k"}
        )
        assert alone.status_code == 201 and alone.json() == bodies[0]
        assert alone.headers["idempotent-replayed"] == "true"
        # ... and, batched again, the same replay and a sold-out event.
        again = await batch([Press(tiny, "ann", "ann-k", None), Press(tiny, "cid", None, None)])
        assert [a[0] for a in again] == [201, 410]
        assert dict(again[0][1])[b"idempotent-replayed"] == b"true"
        for bad, says in [
            (b"not json", "not valid JSON"),
            (b"[]", "array of 1 to"),
            (b'[["e", "u", null]]', "each press must be"),
            (b'[["e", 7, null, null]]', "each press must be"),
        ]:
            r = await http.post(issue_batch.BATCH_PATH, content=bad)
            assert r.status_code == 400 and r.json()["code"] == "MALFORMED_BATCH", r.text
            assert says in r.json()["detail"]
        too_big = b"[" + b'["e","u",null,null],' * 60_000 + b'["e","u",null,null]]'
        r = await http.post(issue_batch.BATCH_PATH, content=too_big)
        assert r.status_code == 413, r.text
        metrics = (await http.get("/metrics")).text
        route = "/internal/v1/events/{eventId}/issue"
        # The batched presses count in the issue route's RED series, the batches in their own.
        assert (
            f'flashcoupon_http_requests_total{{method="POST",route="{route}",'
            'service="issuer",status="423"}' in metrics
        )
        assert (
            'flashcoupon_http_requests_total{method="POST",route="/internal/v1/issue-batch",'
            'service="issuer",status="200"}' in metrics
        )


async def test_a_press_asking_for_an_allowance_is_answered_with_it(
    stack, redis_cluster, events
) -> None:
    """The gateway's per-user limit decided by the issuer (issue.lua): batched or alone, the
    answer says what the allowance left; the press it refuses is a 429 RATE_LIMITED (user
    scope) that issues nothing; a malformed allowance header is a 400."""
    from flashcoupon_common import issue_batch
    from flashcoupon_common.issue_batch import Press

    ev = await provisioned(redis_cluster, events, 5)
    slow = (60_000_000, 2)  # one press a minute, two at once
    async with (
        running(create_app(settings(stack))) as app,
        client(app, "http://i") as http,
    ):
        r = await http.post(
            issue_batch.BATCH_PATH,
            content=issue_batch.encode_presses(
                [
                    Press(ev, "ann", "ann-1", None, slow),
                    Press(ev, "ann", None, None, slow),
                    Press(ev, "ann", None, None, slow),
                    Press(ev, "bob", None, None),
                ]
            ),
        )
        assert r.status_code == 200, r.text
        answers = issue_batch.decode_answers(r.content, 4)
        assert [a[0] for a in answers] == [201, 409, 429, 201]
        said = [dict(a[1]).get(issue_batch.ALLOWANCE_HEADER.lower().encode()) for a in answers]
        assert [issue_batch.parse_allowance(s.decode()) if s else None for s in said] == [
            (1, 60_000_000, 0),
            (0, 120_000_000, 0),
            (0, 120_000_000, 60_000_000),
            None,  # bob asked for none
        ]
        refused = orjson.loads(answers[2][2])
        assert refused["code"] == "RATE_LIMITED" and refused["scope"] == "user"
        assert dict(answers[2][1])[b"retry-after"] == b"60"
        # Alone: her keyed first press again is a replay (never refused), a new one is not.
        header = issue_batch.ALLOWANCE_LIMIT_HEADER
        limit = f"{slow[0]} {slow[1]}"
        user = {"X-Flashcoupon-User": "ann"}
        replay = await http.post(
            ISSUE.format(ev), headers={**user, "Idempotency-Key": "ann-1", header: limit}
        )
        assert replay.status_code == 201 and issue_batch.ALLOWANCE_HEADER not in replay.headers
        again = await http.post(ISSUE.format(ev), headers={**user, header: limit})
        assert again.status_code == 429 and again.json()["code"] == "RATE_LIMITED"
        left, _, retry = issue_batch.parse_allowance(again.headers[issue_batch.ALLOWANCE_HEADER])
        assert left == 0 and 0 < retry <= 60_000_000
        for bad in ("0 2", "60000000", "x y"):
            r = await http.post(ISSUE.format(ev), headers={**user, header: bad})
            assert r.status_code == 400 and r.json()["code"] == "MALFORMED_ALLOWANCE", r.text
        state = await event_state.read_state(redis_cluster, ev)
        assert state is not None and state.issued == 2  # ann's and bob's


async def test_with_allowances_off_the_issuer_answers_as_one_older_than_them(
    stack, redis_cluster, events
) -> None:
    """decide_allowance=False (a roll-back switch): a batch with an allowance is refused as an
    issuer older than the allowance refuses it (400 MALFORMED_BATCH, nothing issued), a batch
    without one is served, and a lone press's allowance header is ignored."""
    from flashcoupon_common import issue_batch
    from flashcoupon_common.issue_batch import Press

    ev = await provisioned(redis_cluster, events, 5)
    slow = (60_000_000, 1)
    async with (
        running(create_app(settings(stack, decide_allowance=False))) as app,
        client(app, "http://i") as http,
    ):
        presses = [Press(ev, "ann", None, None, slow), Press(ev, "bob", None, None)]
        r = await http.post(issue_batch.BATCH_PATH, content=issue_batch.encode_presses(presses))
        assert r.status_code == 400 and r.json()["code"] == "MALFORMED_BATCH", r.text
        state = await event_state.read_state(redis_cluster, ev)
        assert state is not None and state.issued == 0
        r = await http.post(issue_batch.BATCH_PATH, content=issue_batch.encode_presses(presses[1:]))
        assert [a[0] for a in issue_batch.decode_answers(r.content, 1)] == [201]
        limit = {issue_batch.ALLOWANCE_LIMIT_HEADER: f"{slow[0]} {slow[1]}"}
        for _ in range(2):  # a burst of one, yet both decided: the header is not read
            r = await http.post(ISSUE.format(ev), headers={"X-Flashcoupon-User": "cy", **limit})
            assert r.status_code in (201, 409) and issue_batch.ALLOWANCE_HEADER not in r.headers
    assert not await redis_cluster.exists(keys.allowance_key(ev))
