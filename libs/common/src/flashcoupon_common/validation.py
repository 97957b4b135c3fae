"""What the public API accepts as input, defined once for the gateway, the issuer and the wallet.

Each rule is data (a pattern or bounds) plus one check that raises `ProblemError` with the
code every service answers for that mistake; docs/openapi.json is built from the same data
(`Pattern.schema`), so the document cannot drift from what is enforced.

Two things are subtle:

* Patterns are matched with `fullmatch`. `re.match(r"^...$")` accepts a trailing "\\n"
  (`$` matches before a final newline), which let `qa-e\\n` through as an event id and into
  an upstream request line.
* 400 vs 422 is one rule: a malformed request line, query parameter or header, or a body that
  is not a JSON object, is **400** with a code naming the part (`INVALID_EVENT_ID`,
  `INVALID_LIMIT`, `MALFORMED_JSON`, ...); a JSON body that parsed but whose fields are missing,
  of the wrong type or out of range is **422 INVALID_REQUEST**, whatever the field.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from flashcoupon_common.problems import ProblemError

# The codes answered for malformed input (the vocabulary docs/openapi.json lists).
INVALID_EVENT_ID = "INVALID_EVENT_ID"
INVALID_COUPON_CODE = "INVALID_COUPON_CODE"
INVALID_IDEMPOTENCY_KEY = "INVALID_IDEMPOTENCY_KEY"
INVALID_LIMIT = "INVALID_LIMIT"
INVALID_REQUEST = "INVALID_REQUEST"


@dataclass(frozen=True, slots=True)
class Pattern:
    """An identifier: the whole value must match `regex` (unanchored here, anchored in use)."""

    regex: str
    max_length: int
    rule: str  # what an error message says is allowed
    _compiled: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_compiled", re.compile(self.regex))

    def ok(self, value: object) -> bool:
        return isinstance(value, str) and self._compiled.fullmatch(value) is not None

    @property
    def schema(self) -> dict[str, Any]:
        """The JSON Schema of the value (ECMA-262 `$` only matches at the very end)."""
        return {
            "type": "string",
            "minLength": 1,
            "maxLength": self.max_length,
            "pattern": f"^(?:{self.regex})$",
        }


# DNS-1123 label: a Kubernetes object name (event and tier names), so also a Redis hash tag and
# a metric label value.
DNS_LABEL = Pattern(
    r"[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?",
    63,
    "a DNS-1123 label: 1-63 of a-z 0-9 '-', starting and ending with a letter or digit",
)
EVENT_ID = DNS_LABEL
# The issuer keeps request ids inside a Redis hash value separated by ',' and ';'.
IDEMPOTENCY_KEY = Pattern(r"[A-Za-z0-9_.:-]{1,64}", 64, "1-64 of A-Z a-z 0-9 _ . : -")
# Issued codes are 14 Crockford base32 characters; user_coupons.code is VARCHAR(32).
COUPON_CODE = Pattern(r"[A-Za-z0-9_-]{1,32}", 32, "1-32 of A-Z a-z 0-9 _ -")

MAX_ORDER_ID = 64  # user_coupons.order_id is VARCHAR(64)
# Amounts are minor currency units; the cap is the largest integer every JSON client (a
# JavaScript double) represents exactly.
MAX_ORDER_AMOUNT = 2**53 - 1
DEFAULT_LIMIT, MAX_LIMIT = 100, 500


def event_id(value: str) -> str:
    if not EVENT_ID.ok(value):
        raise ProblemError(400, INVALID_EVENT_ID, f"event id must be {EVENT_ID.rule}")
    return value


def coupon_code(value: str) -> str:
    if not COUPON_CODE.ok(value):
        raise ProblemError(400, INVALID_COUPON_CODE, f"coupon code must be {COUPON_CODE.rule}")
    return value


def idempotency_key(value: str | None) -> str | None:
    """The header's value, None when absent; a present but malformed key is refused."""
    if value is not None and not IDEMPOTENCY_KEY.ok(value):
        raise ProblemError(
            400, INVALID_IDEMPOTENCY_KEY, f"Idempotency-Key must be {IDEMPOTENCY_KEY.rule}"
        )
    return value


def limit(raw: str | None) -> int:
    """`?limit=` of a listing: absent → the default; anything but 1..MAX_LIMIT is refused."""
    if raw is None:
        return DEFAULT_LIMIT
    if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_LIMIT:
        raise ProblemError(400, INVALID_LIMIT, f"limit must be an integer from 1 to {MAX_LIMIT}")
    return int(raw)


def printable_id(value: object) -> bool:
    """Free-form identifiers chosen by clients (order ids): printable text, not only blanks.

    `str.isprintable` refuses every control, format, surrogate and unassigned character and
    every separator but the ASCII space, so nothing can end a line or hide in a log.
    """
    return (
        isinstance(value, str)
        and 1 <= len(value) <= MAX_ORDER_ID
        and value.isprintable()
        and not value.isspace()
    )


def invalid_field(detail: str) -> ProblemError:
    return ProblemError(422, INVALID_REQUEST, detail)


def order_id(body: dict[str, Any]) -> str:
    value = body.get("orderId")
    if value is None:
        raise invalid_field("orderId is required")
    if not printable_id(value):
        raise invalid_field(
            f"orderId must be a string of 1-{MAX_ORDER_ID} printable characters, "
            "not only spaces (no control characters)"
        )
    assert isinstance(value, str)
    return value


def order_amount(body: dict[str, Any]) -> int:
    """A positive integer of minor units. A JSON number with no fraction (`5e4`) counts."""
    value = body.get("orderAmount")
    if value is None:
        raise invalid_field("orderAmount is required")
    # bool is an int subclass in Python: `true` must not pass as 1.
    if isinstance(value, float) and value.is_integer() and abs(value) <= MAX_ORDER_AMOUNT:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_ORDER_AMOUNT:
        raise invalid_field(
            f"orderAmount must be an integer from 1 to {MAX_ORDER_AMOUNT} (minor currency units)"
        )
    return value


ORDER_ID_SCHEMA: dict[str, Any] = {
    "type": "string",
    "minLength": 1,
    "maxLength": MAX_ORDER_ID,
    # The C0/C1 control characters; `printable_id` also refuses other non-printable ones.
    "pattern": "^[^\\u0000-\\u001f\\u007f-\\u009f]*$",
    "description": "printable text, not only spaces: no control, format or separator "
    "characters other than the space (Python's str.isprintable)",
}
ORDER_AMOUNT_SCHEMA: dict[str, Any] = {
    "type": "integer",
    "minimum": 1,
    "maximum": MAX_ORDER_AMOUNT,
    "description": "minor currency units",
}
