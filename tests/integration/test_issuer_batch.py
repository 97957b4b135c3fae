"""ScriptBatcher against the real cluster: shared round trips, NOSCRIPT reload, MOVED refresh,
a full batch written at once, and its node connections (resp.NodeConnection): replies over many
reads, a closed connection."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import pytest
import redis
from flashcoupon_common.lua import LuaScript
from flashcoupon_common.redis_batch import ScriptBatcher
from flashcoupon_common.redis_cluster import create_redis_cluster
from flashcoupon_common.resp import NodeConnection, pack
from prometheus_client import REGISTRY
from redis.exceptions import ConnectionError as RedisConnectionError


def fresh_script() -> LuaScript:
    """A script no node has cached yet (its sha is new), so the first EVALSHA gets NOSCRIPT."""
    return LuaScript.from_source(
        "incr", f"-- {uuid.uuid4()}\nreturn redis.call('INCRBY', KEYS[1], ARGV[1])"
    )


def fresh_adder(stride: int = 1) -> LuaScript:
    """Like issue.lua: any number of calls in one run, one reply each, in order; it counts its
    runs. New to every node, as fresh_script."""
    source = (
        f"-- {uuid.uuid4()}\n"
        "redis.call('HINCRBY', KEYS[1], 'runs', 1)\n"
        "local out = {}\n"
        "for i = 1, #ARGV do out[i] = redis.call('HINCRBY', KEYS[1], 'total', ARGV[i]) end\n"
        "return out"
    )
    return LuaScript.from_source("add", source, stride=stride)


@pytest.fixture
async def own_client(stack) -> AsyncIterator[object]:
    client = create_redis_cluster(stack.redis)
    await client.initialize()
    yield client
    await client.aclose()


def _batches(client: str) -> tuple[float, float]:
    """(pipelines sent, calls sent) for one batcher, from its Prometheus histogram."""
    get = REGISTRY.get_sample_value
    labels = {"client": client}
    return (
        get("flashcoupon_redis_batch_size_count", labels) or 0.0,
        get("flashcoupon_redis_batch_size_sum", labels) or 0.0,
    )


async def test_concurrent_calls_share_round_trips_and_reload_scripts(own_client) -> None:
    name = f"batch-{uuid.uuid4().hex[:8]}"
    batcher = ScriptBatcher(own_client, client=name)
    script = fresh_script()
    keys = [f"{{t:{name}:{i % 7}}}:n" for i in range(2000)]
    try:
        results = await asyncio.gather(*(batcher.call(script, [k], [1]) for k in keys))
        # every INCR ran exactly once: the final counters add up to the number of calls
        totals = {k: int(await own_client.get(k)) for k in set(keys)}
        assert sum(totals.values()) == 2000
        assert sorted(results) == sorted(n for k in set(keys) for n in range(1, keys.count(k) + 1))
        batches, calls = _batches(name)
        assert calls >= 2000  # NOSCRIPT retries count as sends too
        assert batches < 200, f"{batches} batches for 2000 calls: round trips not shared"
    finally:
        await own_client.delete(*set(keys))
        await batcher.aclose()


async def test_calls_of_a_stride_script_on_the_same_keys_run_as_one_script(own_client) -> None:
    adder = fresh_adder()
    name = f"stride-{uuid.uuid4().hex[:8]}"
    batcher = ScriptBatcher(own_client, client=name)
    keys = [f"{{t:{name}:{i % 3}}}:h" for i in range(600)]
    try:
        results = await asyncio.gather(*(batcher.call(adder, [k], [1]) for k in keys))
        # each call got its own reply: the running total right after it, 1..n per key
        for key in set(keys):
            mine = sorted(r for k, r in zip(keys, results, strict=True) if k == key)
            assert mine == list(range(1, keys.count(key) + 1))
        runs = [int(await own_client.hget(k, "runs")) for k in set(keys)]
        # merged: far fewer script runs than calls (the first runs met NOSCRIPT, and were
        # retried as they were merged)
        assert sum(runs) <= 30, runs
        _, sent = _batches(name)
        assert sent >= 600  # the batch-size histogram still counts calls, not script runs
    finally:
        await own_client.delete(*set(keys))
        await batcher.aclose()


async def test_calls_submitted_together_run_with_single_calls_and_get_their_replies(
    own_client,
) -> None:
    # submit_many (the issuer's presses of one event, from a batch): one item, one future for
    # the replies of all its calls, merged into the same script run as calls queued alone.
    adder = fresh_adder()
    name = f"many-{uuid.uuid4().hex[:8]}"
    batcher = ScriptBatcher(own_client, client=name, max_batch=8)
    key = f"{{t:{name}}}:h"
    try:
        assert await batcher.call(adder, [key], [1]) == 1  # the script loaded
        alone = batcher.submit(adder, [key], [10])
        together = batcher.submit_many(adder, [key], [100, 1000, 10000])
        after = batcher.submit(adder, [key], [100000])
        assert await asyncio.gather(alone, together, after) == [
            11, [111, 1111, 11111], 111111,
        ]  # fmt: skip
        assert int(await own_client.hget(key, "runs")) == 2  # the load, then one run
        _, sent = _batches(name)
        assert sent == 7  # calls, not queued items (the first one twice: NOSCRIPT)
        # Beyond max_batch calls the queue is cut between items, never inside one: 8 calls
        # go in two runs, the item of 6 whole.
        runs = [batcher.submit_many(adder, [key], [1] * 6), batcher.submit(adder, [key], [1])]
        runs.append(batcher.submit_many(adder, [key], [1, 1]))
        replies = await asyncio.gather(*runs)
        assert [len(r) if isinstance(r, list) else 1 for r in replies] == [6, 1, 2]
        assert int(await own_client.hget(key, "runs")) == 4
        with pytest.raises(ValueError, match="whole strides"):
            batcher.submit_many(fresh_adder(stride=2), [key], [1, 2, 3])
    finally:
        await own_client.delete(key)
        await batcher.aclose()


async def test_stale_slot_map_is_refreshed_after_moved(own_client) -> None:
    batcher = ScriptBatcher(own_client, client="moved-test")
    script = fresh_script()
    key = f"{{t:{uuid.uuid4().hex}}}:n"
    nm = own_client.nodes_manager
    slot = own_client.keyslot(key)
    owner = nm.slots_cache[slot][0]
    wrong = next(
        n for n in nm.nodes_cache.values() if n.server_type == "primary" and n is not owner
    )
    nm.slots_cache[slot] = [wrong]  # as if the slot had moved since the map was read
    try:
        assert await batcher.call(script, [key], [5]) == 5
        assert await own_client.get(key) == b"5"
        assert nm.slots_cache[slot][0].name == owner.name
    finally:
        await own_client.delete(key)
        await batcher.aclose()


async def test_script_errors_reach_the_caller(own_client) -> None:
    batcher = ScriptBatcher(own_client, client="err-test")
    bad = LuaScript.from_source("bad", "return redis.error_reply('BOOM nope')")
    with pytest.raises(Exception, match="nope"):
        await batcher.call(bad, ["{t:x}:k"], [])
    await batcher.aclose()


async def test_a_round_trip_hands_its_replies_over_as_they_are_read(stack) -> None:
    # Many commands in one write, their replies arriving over several reads: all of them, in
    # order, given to on_replies (where the batcher settles its calls) before the caller
    # resumes.
    host, port = stack.redis.nodes[0]
    conn = await NodeConnection.open(host, port)
    seen: list[list[object]] = []
    try:
        payload = b"".join(pack("ECHO", f"{i}-" + "x" * 200) for i in range(2000))
        async with asyncio.timeout(10):  # a lost reply would hang the round trip
            replies = await conn.roundtrip(payload, 2000, seen.append)
        assert [r.split(b"-")[0] for r in replies] == [str(i).encode() for i in range(2000)]
        assert seen == [replies]
        assert await conn.roundtrip(pack("PING"), 1) == [b"PONG"]  # the stream stays in step
    finally:
        conn.close()


async def test_a_connection_the_server_closes_fails_its_round_trip_at_once(own_client) -> None:
    key = f"{{t:{uuid.uuid4().hex}}}:list"
    node = own_client.get_node_from_key(key)  # BLPOP blocks only on the key's owner
    conn = await NodeConnection.open(node.host, node.port)
    killer = await NodeConnection.open(node.host, node.port)
    try:
        [own_id] = await conn.roundtrip(pack("CLIENT", "ID"), 1)
        # Blocked for up to 30 s on the server, then the server drops the connection.
        waiting = asyncio.ensure_future(conn.roundtrip(pack("BLPOP", key, 30), 1))
        await asyncio.sleep(0.05)
        assert await killer.roundtrip(pack("CLIENT", "KILL", "ID", own_id), 1) == [1]  # killed
        async with asyncio.timeout(5):  # at once, not after the BLPOP's 30 s
            with pytest.raises(RedisConnectionError):
                await waiting
        with pytest.raises(RedisConnectionError):
            await conn.roundtrip(pack("PING"), 1)  # closed: refused without a write
    finally:
        conn.close()
        killer.close()


async def test_calls_survive_their_idle_connection_being_closed(own_client) -> None:
    # A node restarted or a connection dropped while idle: the next batch fails on it and is
    # sent again on a new connection (the script's result counts one run per call).
    batcher = ScriptBatcher(own_client, client=f"killed-{uuid.uuid4().hex[:8]}")
    script = fresh_script()
    key = f"{{t:{uuid.uuid4().hex}}}:n"
    try:
        assert await batcher.call(script, [key], [1]) == 1
        idle = [c for q in batcher._queues.values() for c in q.idle]
        assert idle
        for conn in idle:
            [own_id] = await conn.roundtrip(pack("CLIENT", "ID"), 1)
            await own_client.execute_command(
                "CLIENT", "KILL", "ID", own_id, target_nodes=own_client.get_node_from_key(key)
            )
        async with asyncio.timeout(10):
            assert await batcher.call(script, [key], [1]) == 2
    finally:
        await own_client.delete(key)
        await batcher.aclose()


def _held_still_until(reader: redis.Redis, key: str, want: int, seconds: float) -> int:
    """`key`'s counter once it reads `want`, or after `seconds`, read while the event loop is
    blocked (a plain function, no await): whatever ran meanwhile was on the wire before."""
    deadline = time.monotonic() + seconds
    while (got := int(reader.get(key) or 0)) != want and time.monotonic() < deadline:
        time.sleep(0.005)
    return got


async def test_a_full_batch_is_on_the_wire_before_the_turn_ends(own_client) -> None:
    # A full batch is written as its last call is queued, so its node runs it while this
    # process goes on with the turn; a partial one waits for the end of the turn. Checked with
    # the event loop held still (blocking reads from another client): only a batch already
    # written can have run.
    batcher = ScriptBatcher(own_client, client=f"eager-{uuid.uuid4().hex[:8]}", max_batch=4)
    script = fresh_script()
    key = f"{{t:{uuid.uuid4().hex}}}:n"
    node = own_client.get_node_from_key(key)
    reader = redis.Redis(host=node.host, port=node.port)
    try:
        assert await batcher.call(script, [key], [1]) == 1  # script loaded, a connection idle
        full = [batcher.submit(script, [key], [1]) for _ in range(4)]
        assert _held_still_until(reader, key, 5, 5.0) == 5, "the full batch was not written"
        partial = batcher.submit(script, [key], [1])
        assert _held_still_until(reader, key, 6, 0.2) == 5  # a partial one waits for the turn
        assert await asyncio.gather(*full, partial) == [2, 3, 4, 5, 6]
    finally:
        reader.close()
        await own_client.delete(key)
        await batcher.aclose()


async def test_closing_with_a_batch_written_but_not_yet_awaited_closes_its_connection(
    own_client,
) -> None:
    batcher = ScriptBatcher(own_client, client=f"eager-close-{uuid.uuid4().hex[:8]}", max_batch=2)
    script = fresh_script()
    key = f"{{t:{uuid.uuid4().hex}}}:n"
    try:
        await batcher.call(script, [key], [1])
        for _ in range(2):
            batcher.submit(script, [key], [1])  # written now; its task has not run yet
        busy = [c for q in batcher._queues.values() for c in q.busy]
        assert len(busy) == 1
        await batcher.aclose()  # cancels that task before its first step
        assert all(c.transport is not None and c.transport.is_closing() for c in busy)
    finally:
        await own_client.delete(key)
