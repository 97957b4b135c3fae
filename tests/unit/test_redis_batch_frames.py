"""How the batcher merges calls of a stride script into frames, and splits the replies."""

from __future__ import annotations

import asyncio

from flashcoupon_common.lua import LuaScript
from flashcoupon_common.redis_batch import _Call, _frames, _unframe
from redis.exceptions import NoScriptError, ResponseError

MANY = LuaScript("many", "", "a" * 40, stride=1)
ONE = LuaScript("one", "", "b" * 40)


def calls(specs: list[tuple[LuaScript, str]]) -> list[_Call]:
    loop = asyncio.new_event_loop()
    try:
        return [_Call(s, [k], [i], loop.create_future(), 0.0) for i, (s, k) in enumerate(specs)]
    finally:
        loop.close()


def test_stride_calls_on_the_same_keys_share_a_frame_in_queue_order() -> None:
    batch = calls([(MANY, "x"), (ONE, "x"), (MANY, "y"), (MANY, "x"), (ONE, "x")])
    frames = _frames(batch)
    assert [[c.args[0] for c in f] for f in frames] == [[0, 3], [1], [2], [4]]


def test_replies_go_back_to_their_calls() -> None:
    batch = calls([(MANY, "x"), (ONE, "x"), (MANY, "x")])
    frames = _frames(batch)
    done, answers = _unframe(frames, [[b"r0", b"r2"], b"r1"])
    assert [c.args[0] for c in done] == [0, 2, 1]
    assert answers == [b"r0", b"r2", b"r1"]


def test_an_error_reply_concerns_every_call_of_its_frame() -> None:
    batch = calls([(MANY, "x"), (MANY, "x"), (ONE, "y")])
    missing = NoScriptError("NOSCRIPT")
    done, answers = _unframe(_frames(batch), [missing, b"ok"])
    assert answers == [missing, missing, b"ok"]
    assert len(done) == 3


def test_a_reply_of_the_wrong_length_is_an_error_not_a_misdelivery() -> None:
    batch = calls([(MANY, "x"), (MANY, "x")])
    _, answers = _unframe(_frames(batch), [[b"only one"]])
    assert all(isinstance(a, ResponseError) for a in answers) and len(answers) == 2


def test_a_pipeline_cut_short_leaves_the_unanswered_frames_out() -> None:
    batch = calls([(MANY, "x"), (ONE, "y"), (MANY, "z")])
    done, answers = _unframe(_frames(batch), [[b"r0"]])
    assert [c.args[0] for c in done] == [0] and answers == [b"r0"]


def test_an_item_of_calls_submitted_together_gets_the_list_of_its_replies() -> None:
    batch = calls([(MANY, "x"), (MANY, "x"), (ONE, "y")])
    batch[1].count, batch[1].args = 2, [1, 1]  # submit_many of two calls
    done, answers = _unframe(_frames(batch), [[b"r0", b"r1a", b"r1b"], b"r2"])
    assert [c.args[0] for c in done] == [0, 1, 2]
    assert answers == [b"r0", [b"r1a", b"r1b"], b"r2"]
    one = calls([(MANY, "x")])
    one[0].count = 1  # submit_many of one call: still a list
    assert _unframe(_frames(one), [[b"only"]])[1] == [[b"only"]]
    _, short = _unframe(_frames(batch), [[b"r0", b"r1a"], b"r2"])  # one reply short
    assert isinstance(short[0], ResponseError) and isinstance(short[1], ResponseError)
