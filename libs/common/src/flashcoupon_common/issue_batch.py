"""Presses forwarded in batches, gateway → issuer: the wire format of both ends, in one place.

A gateway process forwards the presses that reach it in the same turn of its event loop as
one `POST /internal/v1/issue-batch` to the issuer (flashcoupon_gateway.issue_batch), which
runs each exactly as if it had come alone (its own validation, idempotency, outcome, answer)
and answers them all in one 200. One HTTP exchange instead of dozens is what makes the hop
cheap on both sides: HTTP parsing, ASGI dispatch and the write per request were most of a
forwarded press's CPU (docs/gateway.md, "Forwarding presses in batches").

Request body: a JSON array, one `[eventId, userId, idempotencyKey|null, traceparent|null]`
per press. Answer body: a JSON array in the same order, one `[status, [[name, value], ...],
body]` per press — the headers the lone answer would have had but Content-Length, and the
body as a string of its bytes read as Latin-1 (any bytes survive the round trip).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import orjson

BATCH_PATH = "/internal/v1/issue-batch"
MAX_PRESSES = 1024  # per batch; the gateway sends at most ISSUE_BATCH_MAX (256 by default)
MAX_BYTES = 1 << 20


class Press(NamedTuple):
    event_id: str
    user: str
    key: str | None
    traceparent: str | None


# (status, headers as (lowercase name, value) byte pairs, body), as flashcoupon_common.http1
# gives a lone answer's.
Answer = tuple[int, list[tuple[bytes, bytes]], bytes]


class BatchError(ValueError):
    """A batch body that is not what this module writes; the message says what is wrong."""


def _optional_str(value: object) -> bool:
    return value is None or isinstance(value, str)


def encode_presses(presses: Sequence[Press]) -> bytes:
    return orjson.dumps([tuple(p) for p in presses])  # orjson writes no tuple subclass


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
            or len(item) != 4
            or not isinstance(item[0], str)
            or not isinstance(item[1], str)
            or not _optional_str(item[2])
            or not _optional_str(item[3])
        ):
            raise BatchError(
                "each press must be [eventId, userId, key or null, traceparent or null]"
            )
        presses.append(Press(*item))
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
