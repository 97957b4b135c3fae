"""The upstream pool writes nothing it has not checked, and user ids go out as UTF-8 bytes."""

from __future__ import annotations

import pytest
from flashcoupon_common.http import user_from_header
from flashcoupon_gateway.pool import HTTPPool, UnsafeRequestError, request_head

USER = "X-Flashcoupon-User"


@pytest.mark.parametrize("user", ["alice", "josé-X", "josè-X", "日本語-ユーザー", "🎟️-fan"])
def test_user_ids_are_written_as_utf8_and_read_back_exactly(user: str) -> None:
    head = request_head("POST", "/internal/v1/events/e/issue", "issuer:8081", {USER: user})
    line = next(x for x in head.split(b"\r\n") if x.startswith(USER.encode()))
    raw = line.split(b": ", 1)[1]
    assert raw == user.encode()
    assert user_from_header(raw) == user
    # What Starlette hands the wallet (the bytes decoded as Latin-1) reads back the same.
    assert user_from_header(raw.decode("latin-1")) == user


def test_latin1_bytes_are_not_a_user_id() -> None:
    # What the gateway used to send for josé-X: read as UTF-8 with replacement, it became
    # jos\ufffd-X, the same id as josè-X's.
    assert user_from_header("josé-X".encode("latin-1")) is None


@pytest.mark.parametrize(
    "path",
    [
        "/internal/v1/events/qa-e\n/issue",
        "/internal/v1/events/qa-e\r\nX-Evil: 1\r\n/issue",
        "/v1/events/a b",
        "/v1/events/\x00",
        "/v1/events/\x7f",
        "/v1/events/é",
        "v1/no-leading-slash",
        "",
    ],
)
def test_paths_with_blanks_controls_or_non_ascii_are_refused(path: str) -> None:
    with pytest.raises(UnsafeRequestError, match="the path"):
        request_head("POST", path, "issuer", {})


@pytest.mark.parametrize(
    "value", ["a\r\nX-Evil: 1", "a\nb", "a\rb", "a\x00b", "a\tb", "a\x7fb", "\ud800"]
)
def test_header_values_with_control_characters_are_refused(value: str) -> None:
    with pytest.raises(UnsafeRequestError, match="x-request-id"):
        request_head("GET", "/v1/events/e", "issuer", {"x-request-id": value})


@pytest.mark.parametrize("name", ["X Evil", "X:Evil", "X\r\nEvil", "", "Ü"])
def test_header_names_must_be_tokens(name: str) -> None:
    with pytest.raises(UnsafeRequestError, match="header name"):
        request_head("GET", "/v1/events/e", "issuer", {name: "v"})


def test_method_must_be_a_token() -> None:
    with pytest.raises(UnsafeRequestError, match="method"):
        request_head("GET /x HTTP/1.1\r\n", "/", "issuer", {})


async def test_the_pool_refuses_before_connecting() -> None:
    # Port 9 (discard) on loopback is closed: any connection attempt would be an UpstreamError.
    pool = HTTPPool("http://127.0.0.1:9")
    with pytest.raises(UnsafeRequestError):
        await pool.request("POST", "/x\n", {}, deadline_seconds=1)
