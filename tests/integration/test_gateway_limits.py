"""Rate-limit script and waiting room against the real Redis Cluster."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from flashcoupon_gateway import gcra
from flashcoupon_gateway.ratelimit import Check, RateLimiter, ip_key, user_key
from flashcoupon_gateway.scripts import RATELIMIT, ScriptRunner
from flashcoupon_gateway.sold_out import SoldOutBoard
from flashcoupon_gateway.waiting_room import TicketState, WaitingRoom, room_keys
from prometheus_client import REGISTRY

from tests.support.names import random_name


class CountedCalls:
    """A limiter's script runner with its calls counted, each reply read `late` seconds after
    it came (a Redis round trip read in a long loop turn)."""

    def __init__(self, runner: ScriptRunner, late: float = 0.0) -> None:
        self.calls = 0
        self.late = late
        self._run = runner.run
        runner.run = self._counted  # type: ignore[method-assign]

    async def _counted(self, script, keys, args):
        self.calls += 1
        reply = await self._run(script, keys, args)
        if self.late:
            await asyncio.sleep(self.late)
        return reply


async def test_lua_gcra_matches_the_python_maths(redis_cluster) -> None:
    runner = ScriptRunner(redis_cluster)
    key = user_key(random_name("u"), "api")
    limit = gcra.Limit(per_second=2, burst=3)
    replies = [
        await runner.run(RATELIMIT, [key], [limit.interval_us, limit.burst, 1]) for _ in range(4)
    ]
    assert [r[0] for r in replies] == [1, 1, 1, 0]
    assert [r[2] for r in replies[:3]] == [2, 1, 0]
    # Rejected: retry after about one emission interval (0.5 s), TAT unchanged.
    assert 400_000 < replies[3][1] <= 500_000
    assert 1_400_000 < replies[3][3] <= 1_500_000
    ttl = await redis_cluster.pttl(key)
    assert 0 < ttl <= 1_502
    await runner.aclose()


async def test_concurrent_decisions_admit_burst_plus_rate(redis_cluster) -> None:
    runner = ScriptRunner(redis_cluster)
    limiter = RateLimiter(runner, event_shards=4)
    event = random_name("ev")
    admitted = 0
    start = time.monotonic()

    async def hammer() -> None:
        nonlocal admitted
        while time.monotonic() - start < 2.0:
            check = limiter.event_check(event, 200)
            reply = await runner.run(RATELIMIT, [check.key], [check.limit.interval_us,
                                                               check.limit.burst, 1])  # fmt: skip
            admitted += int(reply[0])
            await asyncio.sleep(0.001)

    await asyncio.gather(*(hammer() for _ in range(20)))
    elapsed = time.monotonic() - start
    burst = 4 * limiter.event_check(event, 200).limit.burst
    expected = 200 * elapsed + burst
    assert abs(admitted - expected) <= 0.05 * expected, (admitted, expected)
    await runner.aclose()


async def test_rejections_are_remembered_locally(redis_cluster) -> None:
    runner = ScriptRunner(redis_cluster)
    limiter = RateLimiter(runner, event_shards=1)
    check = Check("user", user_key(random_name("u"), "api"), gcra.Limit(1, 1))
    await limiter.check_all([[check]])
    for where in ("redis", "local"):
        try:
            await limiter.check_all([[check]])
        except Exception as exc:
            assert exc.status == 429 and int(exc.headers["Retry-After"]) == 1, where
        else:
            raise AssertionError("second request within the interval must be limited")
    assert limiter.deny.blocked_for(check.key) > 0
    await runner.aclose()


async def test_a_new_shopper_from_a_new_address_is_decided_by_both_checks(redis_cluster) -> None:
    # The crowd's usual stage: the IP and the user check each one script call, sent together.
    runner = ScriptRunner(redis_cluster)
    limiter = RateLimiter(runner, event_shards=1)
    # A slow refill (1/s): on a loaded machine 10 ms between presses refilled a token of 100/s.
    ip = Check("ip", ip_key(random_name("10.0.")), gcra.Limit(1, 3))
    user = Check("user", user_key(random_name("u"), "api"), gcra.Limit(1, 2))
    first = await limiter.check_all([[ip, user]])
    assert [(o.check.scope, o.allowed, o.remaining) for o in first] == [
        ("ip", True, 2),
        ("user", True, 1),
    ]
    await limiter.check_all([[ip, user]])
    try:
        await limiter.check_all([[ip, user]])  # the user's burst of 2 is spent, the IP's is not
    except Exception as exc:
        assert exc.status == 429 and exc.extra["scope"] == "user", exc
    else:
        raise AssertionError("the third press within the user's burst must be limited")
    assert limiter.deny.blocked_for(user.key) > 0
    assert limiter.deny.blocked_for(ip.key) == 0
    # Redis debited the IP three times: a fourth press from it is over its burst of 3.
    assert (await runner.run(RATELIMIT, [ip.key], [ip.limit.interval_us, 3, 1]))[0] == 0
    await runner.aclose()


async def test_waiting_room_admits_5000_in_ticket_order_at_the_rate(redis_cluster) -> None:
    runner = ScriptRunner(redis_cluster)
    room = WaitingRoom(
        runner, "k" * 32, ticket_ttl_seconds=600, sold_out=SoldOutBoard(), tick_seconds=0.05
    )
    event, rate, shoppers = random_name("ev"), 1000.0, 5000
    start_ms = int(time.time() * 1000) + 4000  # queue opens before the event starts

    async def enter(i: int):
        return await room.enter(event, f"user-{i}", rate, start_ms)

    answers = []
    for chunk in range(0, shoppers, 500):
        answers += await asyncio.gather(*(enter(i) for i in range(chunk, chunk + 500)))
    assert time.time() * 1000 < start_ms, "enqueueing took too long for this test's timing"
    assert all(a.state is TicketState.QUEUED for a in answers)
    assert sorted(a.n for a in answers) == list(range(1, shoppers + 1))
    assert all(a.position == a.n for a in answers)  # nobody admitted before the start
    again = await enter(17)
    assert again.n == answers[17].n and again.state is TicketState.QUEUED
    assert queue_length(event) == shoppers  # the gauge SREs watch: everyone still waits

    # Watch a few tickets while the room drains: positions only ever go down.
    watched = [answers[i] for i in (0, 999, 2500, 4999)]
    seen: dict[int, list[int]] = {a.n: [] for a in watched}
    room.start()
    log_key = room_keys(event)[4]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for a in watched:
            user = f"user-{answers.index(a)}"
            s = await room.status(event, user, a.n, rate, start_ms)
            seen[a.n].append(0 if s.state is TicketState.READY else s.position)
        if await redis_cluster.llen(log_key) >= shoppers:
            break
        await asyncio.sleep(0.2)
    await room.stop()

    log = [e.decode().split(":") for e in await redis_cluster.lrange(log_key, 0, -1)]
    order = [int(n) for n, _ in log]
    assert order == list(range(1, shoppers + 1)), "admission must follow ticket order"
    times = [int(ms) for _, ms in log]
    assert times == sorted(times) and times[0] >= start_ms
    # Ticket n is due at start + n/rate; the ticker pops it within a tick or two of that.
    lateness = [t - (start_ms + n * 1000 / rate) for n, t in zip(order, times, strict=True)]
    assert min(lateness) >= -2, min(lateness)
    assert sorted(lateness)[int(0.99 * shoppers)] < 300, "admission lags the configured rate"
    achieved = shoppers / ((times[-1] - start_ms) / 1000)
    assert abs(achieved - rate) <= 0.05 * rate, achieved
    for n, positions in seen.items():
        assert positions == sorted(positions, reverse=True), (n, positions)
        assert positions[-1] == 0

    # An admitted ticket is single-use, and only for its owner.
    first = answers[0]
    wrong = await room.consume(event, "user-1", first.n, rate, start_ms)
    assert wrong.state is TicketState.GONE
    used = await room.consume(event, "user-0", first.n, rate, start_ms)
    assert used.state is TicketState.ADMITTED
    again = await room.consume(event, "user-0", first.n, rate, start_ms)
    assert again.state is TicketState.GONE
    assert queue_length(event) == 0  # drained: nobody waits any more
    await runner.aclose()


def queue_length(event: str) -> float | None:
    return REGISTRY.get_sample_value("flashcoupon_gateway_queue_length", {"event": event})


async def redis_time(redis_cluster: Any, key: str) -> float:
    """The clock of the Redis master that owns `key`, in seconds."""
    node = redis_cluster.get_node_from_key(key)
    seconds, micros = await redis_cluster.time(target_nodes=node)
    return seconds + micros / 1_000_000


async def test_leases_save_redis_calls_and_never_over_admit(redis_cluster) -> None:
    # Two replicas' limiters on one hot key (a NAT'ed IP, say): far fewer Redis calls than
    # requests while the limit does not bind, and never more admissions than it allows when
    # it does.
    runner = ScriptRunner(redis_cluster)
    counted = CountedCalls(runner)
    replicas = [RateLimiter(runner, event_shards=1) for _ in range(2)]

    async def hammer(check: Check, seconds: float) -> tuple[int, int, float]:
        admitted = requests = 0
        start = time.monotonic()

        async def client(limiter: RateLimiter) -> None:
            nonlocal admitted, requests
            while time.monotonic() - start < seconds:
                requests += 1
                try:
                    await limiter.check_all([[check]])
                    admitted += 1
                except Exception as exc:
                    assert exc.status == 429
                    await asyncio.sleep(0.001)
                await asyncio.sleep(0)

        await asyncio.gather(*(client(replicas[i % 2]) for i in range(40)))
        return admitted, requests, time.monotonic() - start

    # Roomy for any machine: a fast one sent ~120k requests in the second, which a limit of
    # 100k/s with a burst of 20k may rightly refuse a few of.
    roomy = Check("ip", "{rl:ip:" + random_name("ip") + "}", gcra.Limit(1_000_000, 200_000))
    admitted, requests, _ = await hammer(roomy, 1.0)
    assert admitted == requests and counted.calls < requests / 4, (counted.calls, requests)

    tight = Check("ip", "{rl:ip:" + random_name("ip") + "}", gcra.Limit(2000, 400))
    # The limit is kept in the Redis server's clock (TIME), a wall clock: one being slewed runs
    # fast or slow against this process's monotonic clock (0.5 % fast on one machine, 7.5 ms
    # in 1.5 s: 15 admissions more), so the round is timed by the server's clock.
    before = await redis_time(redis_cluster, tight.key)
    admitted, requests, _ = await hammer(tight, 1.5)
    elapsed = await redis_time(redis_cluster, tight.key) - before
    assert requests > admitted > 0
    assert admitted <= 400 + 2000 * elapsed, (admitted, elapsed)
    await runner.aclose()


async def test_presses_queued_behind_a_late_lease_call_are_served_by_its_reply(
    redis_cluster,
) -> None:
    # Under a crowd a loop turn can outlast a lease (LEASE_SECONDS): here every reply is read
    # 150 ms after the call. The presses queued behind a lease call take its tokens as its
    # reply is read; when each took them on waking, the lease had expired by then and they
    # asked again one by one (one call per press, seconds of queueing).
    runner = ScriptRunner(redis_cluster)
    counted = CountedCalls(runner, late=0.15)
    limiter = RateLimiter(runner, event_shards=1)
    roomy = Check("ip", ip_key(random_name("ip")), gcra.Limit(1_000_000, 200_000))
    outcomes = await asyncio.gather(*(limiter.check_all([[roomy]]) for _ in range(300)))
    assert all(o[0].allowed for o in outcomes)
    assert counted.calls <= 6, counted.calls
    assert not limiter._inflight  # nothing left waiting on the key

    # When the limit binds (replies read at once now), the queue shares each call's tokens,
    # is handed the refusal, and never admits more than the limit allows.
    counted.late, counted.calls = 0.0, 0
    tight = Check("ip", ip_key(random_name("ip")), gcra.Limit(1000, 400))
    start = await redis_time(redis_cluster, tight.key)  # the limit's clock, as above
    results = await asyncio.gather(
        *(limiter.check_all([[tight]]) for _ in range(2000)), return_exceptions=True
    )
    elapsed = await redis_time(redis_cluster, tight.key) - start
    refused = [r for r in results if isinstance(r, BaseException)]
    assert all(getattr(r, "status", None) == 429 for r in refused), refused[:1]
    admitted = len(results) - len(refused)
    assert refused and 400 <= admitted <= 400 + 1000 * elapsed, (admitted, elapsed)
    assert counted.calls < 100, counted.calls
    assert not limiter._inflight
    await runner.aclose()


async def test_a_press_cancelled_on_its_turn_to_ask_passes_the_turn_on(redis_cluster) -> None:
    # A press handed the turn to make the next lease call, then cancelled (its client went)
    # before it ran: the turn goes to the next press still waiting, or the key's queue would
    # wait for a call nobody makes.
    runner = ScriptRunner(redis_cluster)
    limiter = RateLimiter(runner, event_shards=1)
    key = Check("ip", ip_key(random_name("ip")), gcra.Limit(1_000_000, 200_000))
    tasks: list[asyncio.Task] = []
    real_serve = limiter._serve_queue
    handed: list[bool] = []

    def serve_then_cancel(c, queue, outcome) -> None:
        real_serve(c, queue, outcome)
        if limiter._inflight and not handed:  # a waiting press was handed the turn
            handed.append(True)
            for task in tasks[:150]:
                task.cancel()

    limiter._serve_queue = serve_then_cancel  # type: ignore[method-assign]
    tasks.extend(asyncio.create_task(limiter.check_all([[key]])) for _ in range(200))
    done = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
    assert handed, "no press was handed the turn: the test did not reach its case"
    assert all(not isinstance(d, BaseException) and d[0].allowed for d in done[150:])
    assert not limiter._inflight
    await runner.aclose()
