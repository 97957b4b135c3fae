"""The demo's Redis commands per server (redis_calls): parsing INFO commandstats, the deltas."""

from __future__ import annotations

from flashcoupon_loadtest.redis_calls import command_delta, parse_commandstats
from flashcoupon_loadtest.report import redis_call_lines

INFO = {
    "cmdstat_evalsha": {"calls": 100, "usec": 2000, "usec_per_call": 20.0, "rejected_calls": 0},
    "cmdstat_command|getkeys": {"calls": 3, "usec": 9, "usec_per_call": 3.0},
    "errorstat_NOSCRIPT": {"count": 1},  # not a command row
}


def test_parse_commandstats() -> None:
    assert parse_commandstats(INFO) == {"evalsha": (100, 2000), "command|getkeys": (3, 9)}
    assert parse_commandstats({}) == {}


def test_delta_per_server_busiest_first() -> None:
    before = {
        "127.0.0.1:17000": ("master", {"evalsha": (100, 2000), "get": (5, 5)}),
        "127.0.0.1:17001": ("master", {"evalsha": (10, 100)}),
        "127.0.0.1:17004": ("replica", {"exec": (0, 0)}),
    }
    after = {
        "127.0.0.1:17000": ("master", {"evalsha": (200, 4400), "get": (5, 5)}),  # get unused
        "127.0.0.1:17001": ("master", {"evalsha": (1010, 113_100), "xadd": (500, 900)}),
        "127.0.0.1:17004": ("replica", {"exec": (20, 900), "xclaim": (500, 1450)}),
        "127.0.0.1:17005": ("replica", {}),  # nothing happened there: left out
    }
    got = command_delta(before, after, top=1)
    assert got is not None and list(got) == [
        "127.0.0.1:17001",
        "127.0.0.1:17000",
        "127.0.0.1:17004",
    ]
    assert got["127.0.0.1:17001"] == {
        "role": "master",
        "commands": {"evalsha": {"calls": 1000, "usec": 113_000, "usec_per_call": 113.0}},
    }
    assert got["127.0.0.1:17000"]["commands"]["evalsha"]["usec_per_call"] == 24.0
    assert list(got["127.0.0.1:17004"]["commands"]) == ["xclaim"]  # top 1 by µs
    assert command_delta({}, after) is None and command_delta(before, {}) is None
    lines = redis_call_lines(command_delta(before, after))
    assert lines[0] == (
        "  redis calls   127.0.0.1:17001 master: evalsha 1,000 x 113.0 us, xadd 500 x 1.8 us"
    )
    assert lines[2].startswith(" " * 16 + "127.0.0.1:17004 replica: xclaim 500 x 2.9 us")
    assert redis_call_lines(None) == []
