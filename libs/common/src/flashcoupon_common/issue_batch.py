"""Presses forwarded in batches, gateway → issuer: the wire format of both ends, in one place.

A gateway process forwards the presses that reach it in the same turn of its event loop as
one `POST /internal/v1/issue-batch` to the issuer (flashcoupon_gateway.issue_batch), which
runs each exactly as if it had come alone (its own validation, idempotency, outcome, answer)
and answers them all in one 200. One HTTP exchange instead of dozens is what makes the hop
cheap on both sides: HTTP parsing, ASGI dispatch and the write per request were most of a
forwarded press's CPU (docs/gateway.md, "Forwarding presses in batches").

Request body: a JSON array, one `[eventId, userId, idempotencyKey|null, traceparent|null]`
per press, or with a fifth element `[intervalUs, burst]` when the issue script is to decide
the shopper's allowance (the gateway's per-user, per-event rate limit) with the issue. Answer
body: a JSON array in the same order, one `[status, [[name, value], ...], body]` per press —
the headers the lone answer would have had but Content-Length, and the body as a string of
its bytes read as Latin-1 (any bytes survive the round trip).

A lone press asks for the allowance with `X-Flashcoupon-Allowance-Limit: <intervalUs>
<burst>`; the answer to a press whose allowance was decided carries `X-Flashcoupon-Allowance:
<left> <resetUs> <retryAfterUs>` (retry > 0: refused, a 429 RATE_LIMITED). Both are internal:
the gateway turns the second into its own RateLimit headers and never relays it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import orjson

BATCH_PATH = "/internal/v1/issue-batch"
MAX_PRESSES = 1024  # per batch; the gateway sends at most ISSUE_BATCH_MAX (256 by default)
MAX_BYTES = 1 << 20


ALLOWANCE_LIMIT_HEADER = "X-Flashcoupon-Allowance-Limit"
ALLOWANCE_HEADER = "X-Flashcoupon-Allowance"


class Press(NamedTuple):
    event_id: str
    user: str
    key: str | None
    traceparent: str | None
    allowance: tuple[int, int] | None = None  # (interval µs, burst) for issue.lua to decide


def allowance_limit(value: object) -> tuple[int, int] | None:
    """(interval µs, burst) from a batch's fifth element or the lone header's two numbers;
    None when `value` is not two positive integers."""
    if isinstance(value, str):
        value = value.split()
    if (
        isinstance(value, list)
        and len(value) == 2
        and all(type(v) is int or (isinstance(v, str) and v.isdigit()) for v in value)
    ):
        interval, burst = int(value[0]), int(value[1])
        if interval > 0 and burst > 0:
            return interval, burst
    return None


def format_allowance(left: int, reset_us: int, retry_after_us: int) -> str:
    return f"{left} {reset_us} {retry_after_us}"


def parse_allowance(value: str) -> tuple[int, int, int] | None:
    """(left, reset µs, retry-after µs) from X-Flashcoupon-Allowance; None if malformed."""
    parts = value.split()
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1]), int(parts[2])


# (status, headers as (lowercase name, value) byte pairs, body), as flashcoupon_common.http1
# gives a lone answer's.
Answer = tuple[int, list[tuple[bytes, bytes]], bytes]


class BatchError(ValueError):
    """A batch body that is not what this module writes; the message says what is wrong."""


def _optional_str(value: object) -> bool:
    return value is None or isinstance(value, str)


def encode_presses(presses: Sequence[Press]) -> bytes:
    # Four elements unless the allowance is asked for: what an issuer without it reads.
    # (orjson writes no tuple subclass: hence tuple().)
    return orjson.dumps([tuple(p) if p.allowance else tuple(p[:4]) for p in presses])


def decode_presses(raw: bytes) -> list[Press]:
    if len(raw) > MAX_BYTES:
        raise BatchError(f"batch body larger than {MAX_BYTES} bytes")
    try:
        items = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise BatchError("batch body is not valid JSON") from None
    if not isinstance(items, list) or not 0 < len(items) <= MAX_PRESSES:
        raise BatchError(f"batch body must be an array of 1 to {MAX_PRESSES} presses")
    presses = []
    for item in items:
        if (
            not isinstance(item, list)
            or len(item) not in (4, 5)
            or not isinstance(item[0], str)
            or not isinstance(item[1], str)
            or not _optional_str(item[2])
            or not _optional_str(item[3])
        ):
            raise BatchError(
                "each press must be [eventId, userId, key or null, traceparent or null"
                ", optionally [intervalUs, burst] or null]"
            )
        limit = None
        if len(item) == 5 and item[4] is not None:
            limit = allowance_limit(item[4]) if isinstance(item[4], list) else None
            if limit is None:
                raise BatchError("a press's allowance must be [intervalUs, burst], both > 0")
        presses.append(Press(item[0], item[1], item[2], item[3], limit))
    return presses


def encode_answers(answers: Sequence[Answer]) -> bytes:
    return orjson.dumps(
        [
            [
                status,
                [
                    [n.decode("latin-1"), v.decode("latin-1")]
                    for n, v in headers
                    if n != b"content-length"
                ],
                body.decode("latin-1"),
            ]
            for status, headers, body in answers
        ]
    )


def decode_answers(raw: bytes, count: int) -> list[Answer]:
    """The answers to a batch of `count` presses; BatchError when the body is not that."""
    try:
        items = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise BatchError("batch answer is not valid JSON") from None
    if not isinstance(items, list) or len(items) != count:
        raise BatchError(f"batch answer must be an array of {count} answers")
    try:
        return [
            (
                int(status),
                [(n.encode("latin-1"), v.encode("latin-1")) for n, v in headers],
                body.encode("latin-1"),
            )
            for status, headers, body in items
        ]
    except (TypeError, ValueError, AttributeError) as exc:
        raise BatchError(f"batch answer is malformed: {exc}") from None
