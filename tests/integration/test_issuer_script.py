"""issue.lua and event_state against the real Redis Cluster.

Covers: the script's codes and tiers equal the Python reference (coupon_math), the redis-py
retry pitfall (same request id twice → the original coupon, never DUPLICATE), perUserLimit,
each non-issue answer, provisioning raise/lower, outbox entries.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from flashcoupon_common import event_state, keys
from flashcoupon_common.coupon_math import coupon_code, pick_tier, tier_draw
from flashcoupon_common.event_spec import EventSpec, TierSpec
from flashcoupon_common.lua import ISSUE, ISSUE_FIELD_ENTRIES
from flashcoupon_common.messages import CouponIssued

from tests.support.issuer import TIERS, make_spec
from tests.support.names import random_name


@pytest.fixture
async def cleanup(redis_cluster) -> AsyncIterator[list[str]]:
    ids: list[str] = []
    yield ids
    for eid in ids:
        await event_state.delete_state(redis_cluster, eid)


async def provisioned(redis, cleanup: list[str], spec: EventSpec) -> EventSpec:
    await event_state.provision(redis, spec)
    cleanup.append(spec.event_id)
    return spec


async def issue(redis, eid: str, user: str, rid: str, tp: str = "") -> list:
    (reply,) = await redis.eval(ISSUE.source, 5, *keys.issue_keys(eid), user, rid, tp, "", "")
    return [v.decode() if isinstance(v, bytes) else v for v in reply]


async def test_script_matches_python_reference(redis_cluster, cleanup) -> None:
    spec = await provisioned(redis_cluster, cleanup, make_spec(200))
    eid = spec.event_id
    secret = (await redis_cluster.hget(keys.config_key(eid), "secret")).decode()
    caps = [20, 180]
    issued = [0, 0]
    for seq in range(200):
        reply = await issue(redis_cluster, eid, f"user-{seq}", f"r{seq}")
        assert reply[0] == "ISSUED" and reply[1] == 199 - seq
        k = pick_tier(tier_draw(secret, seq), [c - i for c, i in zip(caps, issued, strict=True)])
        issued[k] += 1
        assert reply[4] == coupon_code(secret, seq)
        assert reply[5] == TIERS[k].name
    assert issued == caps
    state = await event_state.read_state(redis_cluster, eid)
    assert state is not None
    assert state.issued_by_tier == {"big": 20, "small": 180} == state.tier_quantities
    assert (await issue(redis_cluster, eid, "late", "r-late"))[0] == "SOLD_OUT"
    assert state.phase() == "SoldOut"


async def test_a_single_tier_event_issues_the_reference_codes_without_a_draw(
    redis_cluster, cleanup
) -> None:
    # One tier skips the draw's hash (every draw lands on it): codes and tier as the reference.
    only = TierSpec("only", TIERS[0].discount, 100)
    spec = EventSpec(**{**_fields(make_spec(30)), "tiers": (only,)})
    spec = await provisioned(redis_cluster, cleanup, spec)
    eid = spec.event_id
    secret = (await redis_cluster.hget(keys.config_key(eid), "secret")).decode()
    for seq in range(30):
        reply = await issue(redis_cluster, eid, f"user-{seq}", f"r{seq}")
        assert reply[0] == "ISSUED" and reply[1] == 29 - seq
        assert pick_tier(tier_draw(secret, seq), [30 - seq]) == 0
        assert (reply[4], reply[5]) == (coupon_code(secret, seq), "only")
    state = await event_state.read_state(redis_cluster, eid)
    assert state is not None and state.issued_by_tier == {"only": 30}
    assert (await issue(redis_cluster, eid, "late", "r-late"))[0] == "SOLD_OUT"


async def test_presses_in_one_call_are_decided_as_separate_calls_would_be(
    redis_cluster, cleanup
) -> None:
    # The issuer's batcher sends the presses of one event queued together as one call.
    spec = await provisioned(redis_cluster, cleanup, make_spec(3))
    eid = spec.event_id
    secret = (await redis_cluster.hget(keys.config_key(eid), "secret")).decode()
    presses = [
        ("alice", "r1"),
        ("bob", "r2"),
        ("alice", "r3"),  # a second press without the key: DUPLICATE, with alice's coupon
        ("alice", "r1"),  # alice's first press again: her coupon, flagged as a replay
        ("carol", "r4"),  # the last coupon
        ("dave", "r5"),
    ]
    args = [v for user, rid in presses for v in (user, rid, "", "", "")]
    replies = await redis_cluster.eval(ISSUE.source, 5, *keys.issue_keys(eid), *args)
    replies = [[v.decode() if isinstance(v, bytes) else v for v in r] for r in replies]
    assert [r[0] for r in replies] == [
        "ISSUED",
        "ISSUED",
        "DUPLICATE",
        "ISSUED",
        "ISSUED",
        "SOLD_OUT",
    ]
    alice, bob, duplicate, replay, carol, _ = replies
    assert [alice[4], bob[4], carol[4]] == [coupon_code(secret, seq) for seq in range(3)]
    assert [alice[1], bob[1], carol[1]] == [2, 1, 0]
    assert duplicate[4:12] == alice[4:12]
    assert replay[2] == 1 and replay[4:] == alice[4:]
    state = await event_state.read_state(redis_cluster, eid)
    assert state is not None and state.issued == 3 and sum(state.issued_by_tier.values()) == 3
    assert await redis_cluster.xlen(keys.outbox_key(eid)) == 3
    # a later call goes on from the stock the batch wrote back
    assert (await issue(redis_cluster, eid, "erin", "r6"))[0] == "SOLD_OUT"


async def test_presses_must_come_in_quintuples(redis_cluster, cleanup) -> None:
    spec = await provisioned(redis_cluster, cleanup, make_spec(3))
    with pytest.raises(Exception, match="quintuples"):
        await redis_cluster.eval(ISSUE.source, 5, *keys.issue_keys(spec.event_id), "alice", "r1")
    state = await event_state.read_state(redis_cluster, spec.event_id)
    assert state is not None and state.issued == 0


async def test_same_request_id_twice_returns_the_original_coupon(redis_cluster, cleanup) -> None:
    # What redis-py does when a reply is lost: it sends the same EVALSHA again.
    spec = await provisioned(redis_cluster, cleanup, make_spec(5))
    first = await issue(redis_cluster, spec.event_id, "alice", "req-1")
    again = await issue(redis_cluster, spec.event_id, "alice", "req-1")
    assert first[0] == again[0] == "ISSUED"
    assert again[2] == 1  # flagged as a replay
    assert again[4:] == first[4:]
    other = await issue(redis_cluster, spec.event_id, "alice", "req-2")
    assert other[0] == "DUPLICATE" and other[4] == first[4]
    state = await event_state.read_state(redis_cluster, spec.event_id)
    assert state is not None and state.issued == 1
    assert await redis_cluster.xlen(keys.outbox_key(spec.event_id)) == 1


async def test_a_coupon_expires_its_validity_after_its_issue_in_every_answer(
    redis_cluster, cleanup
) -> None:
    # issue.lua writes a run's issue time and expiry once for all its issues; answers from a
    # later run (a replay, DUPLICATE) still give the coupon's own times, as the outbox does.
    spec = await provisioned(redis_cluster, cleanup, make_spec(5, per_user_limit=1))
    eid = spec.event_id
    validity = int(await redis_cluster.hget(keys.config_key(eid), "vf"))
    first = await issue(redis_cluster, eid, "carol", "req-1")
    await asyncio.sleep(0.01)  # a later run, a later millisecond
    replay = await issue(redis_cluster, eid, "carol", "req-1")
    duplicate = await issue(redis_cluster, eid, "carol", "req-2")
    assert [first[0], replay[0], duplicate[0]] == ["ISSUED", "ISSUED", "DUPLICATE"]
    for reply in (first, replay, duplicate):
        assert (reply[10], reply[11]) == (first[10], str(int(first[10]) + validity))
    ((_, entry),) = await redis_cluster.xrange(keys.outbox_key(eid))
    outboxed = CouponIssued.from_outbox(entry)
    assert (outboxed.issued_at_ms, outboxed.expires_at_ms) == (int(first[10]), int(first[11]))


async def test_per_user_limit_three(redis_cluster, cleanup) -> None:
    spec = await provisioned(redis_cluster, cleanup, make_spec(10, per_user_limit=3))
    replies = [await issue(redis_cluster, spec.event_id, "bob", f"r{i}") for i in range(5)]
    assert [r[0] for r in replies] == ["ISSUED"] * 3 + ["DUPLICATE"] * 2
    assert replies[3][3] == 3 and len(set(r[4] for r in replies[:3])) == 3
    coupons = [c async for c in event_state.iter_issued(redis_cluster, spec.event_id)]
    assert sorted(c.seq for c in coupons) == [1, 2, 3]


async def test_each_refusal_has_its_own_answer(redis_cluster, cleanup) -> None:
    early = await provisioned(
        redis_cluster, cleanup, make_spec(5, start=timedelta(hours=1), end=timedelta(hours=2))
    )
    late = await provisioned(
        redis_cluster, cleanup, make_spec(5, start=timedelta(hours=-2), end=timedelta(hours=-1))
    )
    paused = await provisioned(redis_cluster, cleanup, make_spec(5))
    await event_state.set_paused(redis_cluster, paused.event_id, True)
    assert (await issue(redis_cluster, early.event_id, "u", "r"))[0] == "NOT_STARTED"
    assert (await issue(redis_cluster, late.event_id, "u", "r"))[0] == "ENDED"
    assert (await issue(redis_cluster, paused.event_id, "u", "r"))[0] == "PAUSED"
    assert (await issue(redis_cluster, random_name("nope"), "u", "r"))[0] == "NOT_FOUND"
    # Presses merged into one call get one NOT_FOUND each (the batcher splits the reply by
    # count: one reply too many or too few turns every press of the call into a 503).
    for presses in (2, 3, 7):
        argv = [v for i in range(presses) for v in (f"u{i}", f"r{i}", "", "", "")]
        nope = random_name("nope")
        replies = await redis_cluster.eval(ISSUE.source, 5, *keys.issue_keys(nope), *argv)
        assert [r[0] for r in replies] == [b"NOT_FOUND"] * presses, presses
    await event_state.set_paused(redis_cluster, paused.event_id, False)
    assert (await issue(redis_cluster, paused.event_id, "u", "r"))[0] == "ISSUED"
    with pytest.raises(event_state.ProvisionError):
        await event_state.set_paused(redis_cluster, random_name("nope"), True)


async def test_outbox_entries_decode_and_carry_traceparent(redis_cluster, cleanup) -> None:
    spec = await provisioned(redis_cluster, cleanup, make_spec(4))
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    # Users whose ids are not ASCII or hold the entry's separator, beside plain ones.
    users = ["u0", "odd\x1fone", "ünïcødé 客", "u3"]
    tps = [tp, tp, tp, ""]
    replies = [
        await issue(redis_cluster, spec.event_id, user, f"r{i}", tps[i])
        for i, user in enumerate(users)
    ]
    entries = await redis_cluster.xrange(keys.outbox_key(spec.event_id))
    assert len(entries) == 4
    read = [CouponIssued.read_outbox(fields) for _, fields in entries]
    decoded = [record for record, _ in read]
    assert [d.code for d in decoded] == [r[4] for r in replies]
    assert [d.user_id for d in decoded] == users
    assert [trace for _, trace in read] == tps
    held = {c.code: c async for c in event_state.iter_issued(redis_cluster, spec.event_id)}
    assert {d.code: d for d in decoded} == held
    # The script writes exactly the entry CouponIssued.to_outbox describes (what the loadtest
    # and the relay tests write in its place).
    for (_, fields), record, trace in zip(entries, decoded, tps, strict=True):
        assert fields == {k.encode(): v.encode() for k, v in record.to_outbox(trace).items()}


async def test_field_entries_script_writes_the_earlier_shape(redis_cluster, cleanup) -> None:
    # What relays older than the one-field entry read (the issuer's OUTBOX_ENTRY=fields): the
    # same coupons and codes, a field per value, `tp` only when there is a traceparent.
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    specs = [await provisioned(redis_cluster, cleanup, make_spec(3)) for _ in range(2)]
    for script, spec in zip((ISSUE, ISSUE_FIELD_ENTRIES), specs, strict=True):
        k = keys.issue_keys(spec.event_id)
        await redis_cluster.eval(
            script.source, 5, *k, "u0", "r0", tp, "", "", "u1", "r1", "", "", ""
        )
    one_field, by_field = [
        await redis_cluster.xrange(keys.outbox_key(spec.event_id)) for spec in specs
    ]
    legacy = set(CouponIssued.LEGACY_OUTBOX_FIELDS)
    assert [{k.decode() for k in f} for _, f in by_field] == [legacy | {"tp"}, legacy]
    read = [[CouponIssued.read_outbox(f) for _, f in entries] for entries in (one_field, by_field)]
    assert [trace for _, trace in read[1]] == [tp, ""]
    # The two events differ in their id and secret (so codes and tier draws), not in shape.
    assert [(r.user_id, r.seq, t) for r, t in read[0]] == [
        (r.user_id, r.seq, t) for r, t in read[1]
    ]
    held = {c.code: c async for c in event_state.iter_issued(redis_cluster, specs[1].event_id)}
    assert {r.code: r for r, _ in read[1]} == held


async def test_provision_is_idempotent_raises_and_refuses_lowering(redis_cluster, cleanup) -> None:
    spec = await provisioned(redis_cluster, cleanup, make_spec(10))
    calls: list[tuple[int, int]] = []
    await event_state.provision(redis_cluster, spec, progress=lambda d, t: calls.append((d, t)))
    assert calls[-1] == (10, 10)
    codes = [(await issue(redis_cluster, spec.event_id, f"u{i}", "r"))[4] for i in range(10)]
    assert (await issue(redis_cluster, spec.event_id, "x", "r"))[0] == "SOLD_OUT"
    raised = make_spec(30, event_id=spec.event_id)
    await event_state.provision(redis_cluster, raised)
    codes += [(await issue(redis_cluster, spec.event_id, f"v{i}", "r"))[4] for i in range(20)]
    assert (await issue(redis_cluster, spec.event_id, "y", "r"))[0] == "SOLD_OUT"
    assert len(set(codes)) == 30
    state = await event_state.read_state(redis_cluster, spec.event_id)
    assert state is not None
    assert state.issued_by_tier == {"big": 3, "small": 27} == state.tier_quantities
    with pytest.raises(event_state.ProvisionError, match="below"):
        await event_state.provision(redis_cluster, make_spec(29, event_id=spec.event_id))
    changed = EventSpec(**{**_fields(raised), "tiers": TIERS[::-1]})
    with pytest.raises(event_state.ProvisionError, match="tiers"):
        await event_state.provision(redis_cluster, changed)
    assert await event_state.read_spec(redis_cluster, spec.event_id) == raised
    assert spec.event_id.encode() in await redis_cluster.smembers(keys.EVENTS_REGISTRY)


def _fields(spec: EventSpec) -> dict:
    return {f: getattr(spec, f) for f in spec.__dataclass_fields__}


async def test_the_shoppers_allowance_is_decided_with_the_issue_as_gcra_decides(
    redis_cluster, cleanup
) -> None:
    """A press that carries an allowance (the gateway's per-user limit) is decided by the
    script with the issue, exactly as gcra.decide would (one run: one server clock); a replay
    is never refused nor debited, a press without an allowance is not limited, a refused press
    issues nothing, and the allowance hash expires once its TATs have passed."""
    from flashcoupon_gateway.gcra import Limit, decide

    spec = await provisioned(redis_cluster, cleanup, make_spec(10))
    eid = spec.event_id
    limit = Limit(1.0, 3)
    allow = (str(limit.interval_us), str(limit.burst))
    presses = [
        ("ann", "r1", *allow),
        ("ann", "r1", *allow),  # her first press again: the coupon, not limited
        ("bob", "r2", "", ""),  # no allowance asked: not limited here
        ("ann", "r3", *allow),  # DUPLICATE, debited
        ("ann", "r4", *allow),
        ("ann", "r5", *allow),  # the fourth within her burst of 3: refused
        ("cid", "r6", *allow),  # another shopper: his own allowance
    ]
    args = [v for user, rid, interval, burst in presses for v in (user, rid, "", interval, burst)]
    replies = await redis_cluster.eval(ISSUE.source, 5, *keys.issue_keys(eid), *args)
    replies = [[v.decode() if isinstance(v, bytes) else v for v in r] for r in replies]
    assert [r[0] for r in replies] == [
        "ISSUED", "ISSUED", "ISSUED", "DUPLICATE", "DUPLICATE", "LIMITED", "ISSUED",
    ]  # fmt: skip
    # The reference: ann's four decisions at one instant, then cid's first.
    tat, expected = None, []
    for _ in range(4):
        d = decide(tat, 0, limit)
        expected.append((d.allowed, d.remaining, d.reset_us, d.retry_after_us))
        tat = d.new_tat if d.allowed else tat
    ann = [replies[0], replies[3], replies[4], replies[5]]
    got = [(r[0] != "LIMITED", r[-2], r[-1], r[1] if r[0] == "LIMITED" else 0) for r in ann]
    assert (
        got
        == expected
        == [
            (True, 2, 1_000_000, 0),
            (True, 1, 2_000_000, 0),
            (True, 0, 3_000_000, 0),
            (False, 0, 3_000_000, 1_000_000),
        ]
    )
    assert replies[6][-2:] == [2, 1_000_000]
    assert len(replies[1]) == 12 and replies[1][2] == 1  # the replay: no allowance values
    assert len(replies[2]) == 12  # bob: none either
    assert replies[5] == ["LIMITED", 1_000_000, 0, 0, 0, 3_000_000]
    state = await event_state.read_state(redis_cluster, eid)
    assert state is not None and state.issued == 3  # ann, bob, cid; nothing for the refusal
    allowance = await redis_cluster.hgetall(keys.allowance_key(eid))
    assert set(allowance) == {b"ann", b"cid"}
    assert 0 < await redis_cluster.pttl(keys.allowance_key(eid)) <= 3_001
    await event_state.delete_state(redis_cluster, eid)
    assert not await redis_cluster.exists(keys.allowance_key(eid))
