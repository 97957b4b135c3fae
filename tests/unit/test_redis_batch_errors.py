"""The batcher's reply parser turns Redis error replies into redis-py's exception classes.

resp.py (the batcher's wire code) borrows redis-py's private `BaseParser.parse_error` for that
(redis pinned <9 in libs/common/pyproject.toml): if an upgrade changes it, this test says so
before a MOVED or NOSCRIPT reply turns into a generic error in production.
"""

from __future__ import annotations

import hiredis
import pytest
from flashcoupon_common.resp import make_reader
from redis.exceptions import AskError, MovedError, NoScriptError, ResponseError, TryAgainError


@pytest.mark.parametrize(
    ("reply", "kind"),
    [
        (b"-MOVED 3999 127.0.0.1:17001\r\n", MovedError),
        (b"-ASK 3999 127.0.0.1:17002\r\n", AskError),
        (b"-NOSCRIPT No matching script.\r\n", NoScriptError),
        (b"-TRYAGAIN Multiple keys request during rehashing of slot\r\n", TryAgainError),
        (b"-ERR something else\r\n", ResponseError),
    ],
)
def test_error_replies_become_redis_py_exceptions(reply: bytes, kind: type[Exception]) -> None:
    reader = make_reader()
    reader.feed(reply)
    error = reader.gets()
    assert type(error) is kind


def test_a_normal_reply_is_not_an_error() -> None:
    reader = make_reader()
    assert isinstance(reader, hiredis.Reader)
    reader.feed(b"*2\r\n:1\r\n$3\r\nabc\r\n")
    assert reader.gets() == [1, b"abc"]
