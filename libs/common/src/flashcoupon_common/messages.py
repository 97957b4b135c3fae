"""The messages that cross process boundaries, defined once.

An issued coupon travels: Lua script → outbox stream entry (its values in one field, written by
the script) → relay → Kafka `coupon-issued` (versioned JSON value, key = user id) → persister.
`CouponIssued` is the one definition of that record; the outbox entry's layout and the JSON
value are both derived from it here, so the script, the relay and the persister agree.

Schema evolution: `SCHEMA_VERSION` is carried in every Kafka value as "v". A consumer that
sees a version it does not know raises `SchemaError`, and the persister dead-letters it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

import orjson

SCHEMA_VERSION = 1

DiscountType = Literal["fixed", "percent"]


class SchemaError(ValueError):
    """A message that can never be processed: undecodable, wrong version, missing fields."""


@dataclass(frozen=True, slots=True)
class Discount:
    """A tier's discount: a fixed amount, or a percent of the order capped at max_amount."""

    type: DiscountType
    amount: int | None = None
    percent: int | None = None
    max_amount: int | None = None

    def to_json(self) -> dict[str, Any]:
        if self.type == "fixed":
            return {"type": "fixed", "amount": self.amount}
        out: dict[str, Any] = {"type": "percent", "percent": self.percent}
        if self.max_amount is not None:
            out["maxAmount"] = self.max_amount
        return out

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Discount:
        kind = raw.get("type")
        if kind == "fixed":
            return cls("fixed", amount=_int(raw, "amount"))
        if kind == "percent":
            cap = raw.get("maxAmount")
            return cls(
                "percent",
                percent=_int(raw, "percent"),
                max_amount=None if cap is None else int(cap),
            )
        raise SchemaError(f"discount.type must be fixed or percent, got {kind!r}")

    def apply(self, order_amount: int) -> int:
        """The discount on an order: never more than the order itself."""
        if self.type == "fixed":
            value = self.amount or 0
        else:
            value = order_amount * (self.percent or 0) // 100
            if self.max_amount is not None:
                value = min(value, self.max_amount)
        return max(0, min(value, order_amount))


@dataclass(frozen=True, slots=True)
class CouponIssued:
    """One coupon issued to one user in one event.

    `seq` is the user's n-th coupon in the event (1..perUserLimit); with `code` it is what the
    MySQL UNIQUE constraints are built on, so replays of this record are harmless.
    """

    event_id: str
    user_id: str
    seq: int
    code: str
    tier: str
    discount: Discount
    issued_at_ms: int
    expires_at_ms: int
    request_id: str

    # ---- outbox stream entry (what the Lua script XADDs)
    # One field, OUTBOX_FIELD: the values of OUTBOX_ORDER joined by OUTBOX_SEPARATOR (the ASCII
    # unit separator). One field rather than one per value: the event's master spends ~9 % less
    # CPU per issue (docs/redis-layout.md), and its replica receives one short XADD. No value
    # holds the separator — ids, codes, tier names, request ids and traceparents are validated
    # formats, the rest numbers — except perhaps the user id, free printable text: it goes last,
    # and whatever follows the twelfth separator is the user's.
    # Entries of the earlier shape (a field per value, named as in LEGACY_OUTBOX_FIELDS, plus `tp`
    # when there was a traceparent) are still read: a stream may hold them across a rollout.
    OUTBOX_FIELD = "v"
    OUTBOX_SEPARATOR = "\x1f"
    OUTBOX_ORDER = ("e", "s", "c", "t", "dt", "da", "dp", "dm", "at", "ex", "r", "tp", "u")
    LEGACY_OUTBOX_FIELDS = ("e", "u", "s", "c", "t", "dt", "da", "dp", "dm", "at", "ex", "r")

    @classmethod
    def read_outbox(cls, fields: Mapping[bytes | str, bytes | str]) -> tuple[CouponIssued, str]:
        """(the record, its traceparent or '') from an outbox entry of either shape."""
        try:
            # Inlined decoding rather than a helper: this runs once per relayed record.
            f = {
                (k.decode() if isinstance(k, bytes) else k): (
                    v.decode() if isinstance(v, bytes) else v
                )
                for k, v in fields.items()
            }
            packed = f.get(cls.OUTBOX_FIELD)
            if packed is not None:
                order = cls.OUTBOX_ORDER
                values = packed.split(cls.OUTBOX_SEPARATOR, len(order) - 1)
                if len(values) != len(order):
                    raise SchemaError(f"outbox entry {packed!r}: {len(values)} of {len(order)}")
                f = dict(zip(order, values, strict=True))
            kind = f["dt"]
            if kind not in ("fixed", "percent"):
                raise SchemaError(f"outbox entry has discount type {kind!r}")
            discount = Discount(
                "fixed" if kind == "fixed" else "percent",
                amount=int(f["da"]) if f["da"] else None,
                percent=int(f["dp"]) if f["dp"] else None,
                max_amount=int(f["dm"]) if f["dm"] else None,
            )
            record = cls(
                f["e"],
                f["u"],
                int(f["s"]),
                f["c"],
                f["t"],
                discount,
                int(f["at"]),
                int(f["ex"]),
                f["r"],
            )
            return record, f.get("tp", "")
        except SchemaError:
            raise
        except (KeyError, ValueError) as exc:  # a value missing, not a number, not UTF-8
            raise SchemaError(f"malformed outbox entry {dict(fields)!r}: {exc}") from None

    @classmethod
    def from_outbox(cls, fields: Mapping[bytes | str, bytes | str]) -> CouponIssued:
        return cls.read_outbox(fields)[0]

    def to_outbox(self, traceparent: str = "") -> dict[str, str]:
        """The entry issue.lua writes for this record (the loadtest and tests write it too)."""
        d = self.discount
        values = {
            "e": self.event_id,
            "s": str(self.seq),
            "c": self.code,
            "t": self.tier,
            "dt": d.type,
            "da": "" if d.amount is None else str(d.amount),
            "dp": "" if d.percent is None else str(d.percent),
            "dm": "" if d.max_amount is None else str(d.max_amount),
            "at": str(self.issued_at_ms),
            "ex": str(self.expires_at_ms),
            "r": self.request_id,
            "tp": traceparent,
            "u": self.user_id,
        }
        return {self.OUTBOX_FIELD: self.OUTBOX_SEPARATOR.join(values[k] for k in self.OUTBOX_ORDER)}

    # ---- Kafka `coupon-issued`
    def kafka_key(self) -> bytes:
        """Keyed by user so one user's coupons stay in order on one partition."""
        return self.user_id.encode()

    def encode(self) -> bytes:
        # Not dataclasses.asdict: its recursive deepcopy cost more than everything else the
        # relay does per record (measured). Same keys, same order, same bytes.
        body: dict[str, Any] = {f: getattr(self, f) for f in self.__dataclass_fields__}
        body["discount"] = self.discount.to_json()
        body["v"] = SCHEMA_VERSION
        body["type"] = "coupon.issued"
        return orjson.dumps(body)

    @classmethod
    def decode(cls, raw: bytes) -> CouponIssued:
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise SchemaError(f"not JSON: {exc}") from None
        if not isinstance(body, dict):
            raise SchemaError("value is not a JSON object")
        if body.get("v") != SCHEMA_VERSION or body.get("type") != "coupon.issued":
            raise SchemaError(f"unknown schema v={body.get('v')!r} type={body.get('type')!r}")
        try:
            return cls(
                event_id=_str(body, "event_id"),
                user_id=_str(body, "user_id"),
                seq=_int(body, "seq"),
                code=_str(body, "code"),
                tier=_str(body, "tier"),
                discount=Discount.from_json(body["discount"]),
                issued_at_ms=_int(body, "issued_at_ms"),
                expires_at_ms=_int(body, "expires_at_ms"),
                request_id=_str(body, "request_id"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SchemaError(f"bad coupon.issued: {exc!r}") from None


@dataclass(frozen=True, slots=True)
class CouponRedeemed:
    """Published on `coupon-redeemed` after a redemption commits."""

    event_id: str
    user_id: str
    code: str
    order_id: str
    order_amount: int
    discount_amount: int
    redeemed_at_ms: int

    def kafka_key(self) -> bytes:
        return self.user_id.encode()

    def encode(self) -> bytes:
        body = asdict(self)
        body["v"] = SCHEMA_VERSION
        body["type"] = "coupon.redeemed"
        return orjson.dumps(body)

    @classmethod
    def decode(cls, raw: bytes) -> CouponRedeemed:
        try:
            body = orjson.loads(raw)
            if body.get("v") != SCHEMA_VERSION or body.get("type") != "coupon.redeemed":
                raise SchemaError(f"unknown schema v={body.get('v')!r} type={body.get('type')!r}")
            return cls(**{k: body[k] for k in cls.__dataclass_fields__})
        except (orjson.JSONDecodeError, AttributeError, KeyError, TypeError) as exc:
            raise SchemaError(f"bad coupon.redeemed: {exc!r}") from None


def _s(v: bytes | str) -> str:
    return v.decode() if isinstance(v, bytes) else v


def _str(body: Mapping[str, Any], key: str) -> str:
    value = body[key]
    if not isinstance(value, str) or not value:
        raise SchemaError(f"{key} must be a non-empty string")
    return value


def _int(body: Mapping[str, Any], key: str) -> int:
    value = body[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise SchemaError(f"{key} must be an integer")
    return value
