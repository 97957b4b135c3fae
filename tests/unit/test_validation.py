"""The shared input rules (flashcoupon_common.validation): full-match, printable, bounded."""

from __future__ import annotations

from typing import Any

import pytest
from flashcoupon_common import validation
from flashcoupon_common.event_state import ProvisionError, validate_event_id
from flashcoupon_common.http import ProblemError
from flashcoupon_gateway import service as gateway
from flashcoupon_issuer import http as issuer
from flashcoupon_operator.manifest import ManifestError, parse_manifests
from flashcoupon_wallet.redemption import parse_request


def refused(call: Any, *args: Any) -> tuple[int, str]:
    with pytest.raises(ProblemError) as err:
        call(*args)
    return err.value.status, err.value.code


@pytest.mark.parametrize(
    "value", ["qa-e\n", "qa-e\r", "\nqa-e", "qa e", "QA-E", "-qa", "qa-", "", "a" * 64, "qa\x00e"]
)
def test_malformed_event_ids_are_400_everywhere(value: str) -> None:
    assert not validation.EVENT_ID.ok(value)
    assert refused(validation.event_id, value) == (400, "INVALID_EVENT_ID")
    assert refused(gateway.checked_event_id, value) == (400, "INVALID_EVENT_ID")
    reply = issuer._check(value, "alice", None)
    assert reply is not None and reply.status == 400
    assert b'"INVALID_EVENT_ID"' in reply.body
    with pytest.raises(ProvisionError):
        validate_event_id(value)


@pytest.mark.parametrize("value", ["qa-e", "a", "a" * 63, "0-9"])
def test_well_formed_event_ids_pass(value: str) -> None:
    assert validation.event_id(value) == value
    assert issuer._check(value, "alice", None) is None


@pytest.mark.parametrize("value", ["k1\n", "a b", "a,b", "a;b", "", "k" * 65, "ключ"])
def test_malformed_idempotency_keys_have_one_code(value: str) -> None:
    assert refused(validation.idempotency_key, value) == (400, "INVALID_IDEMPOTENCY_KEY")
    reply = issuer._check("qa-e", "alice", value)
    assert reply is not None and b'"INVALID_IDEMPOTENCY_KEY"' in reply.body


def test_idempotency_key_absent_or_well_formed() -> None:
    assert validation.idempotency_key(None) is None
    assert validation.idempotency_key("K1_a.b:c-" + "x" * 55) == "K1_a.b:c-" + "x" * 55


@pytest.mark.parametrize("value", ["ABC\n", "A/B", "A" * 33, "", "A B"])
def test_malformed_coupon_codes(value: str) -> None:
    assert refused(gateway.checked_code, value) == (400, "INVALID_COUPON_CODE")


def test_manifest_names_are_full_matched() -> None:
    text = 'apiVersion: flashcoupon.io/v1alpha1\nkind: CouponEvent\nmetadata: {name: "qa-e\\n"}\n'
    with pytest.raises(ManifestError, match="DNS-1123"):
        parse_manifests(text)


@pytest.mark.parametrize(
    ("order_id", "ok"),
    [
        ("o-1", True),
        ("주문 7/🎁", True),
        ("a" * 64, True),
        ("a\u0000b", False),
        ("a\nb", False),
        ("a\tb", False),
        ("a\u200bb", False),  # zero-width space: invisible in every log and admin screen
        ("a\u2028b", False),  # line separator
        ("   ", False),
        ("", False),
        ("a" * 65, False),
        (5, False),
    ],
)
def test_order_ids_are_printable_and_bounded(order_id: object, ok: bool) -> None:
    body = {"orderId": order_id, "orderAmount": 10}
    if ok:
        assert validation.order_id(body) == order_id
        assert parse_request(body).order_id == order_id
    else:
        assert refused(validation.order_id, body) == (422, "INVALID_REQUEST")
        assert refused(parse_request, body) == (422, "INVALID_REQUEST")


@pytest.mark.parametrize("amount", [0, -1, 1.5, 10**20, 1e20, 2**53, "10", True, None])
def test_bad_amounts_are_all_422_with_the_bound(amount: object) -> None:
    body = {"orderId": "o", "orderAmount": amount}
    with pytest.raises(ProblemError) as err:
        validation.order_amount(body)
    assert (err.value.status, err.value.code) == (422, "INVALID_REQUEST")
    if amount is not None:
        # 10^20 is out of range, not "not an integer": the message states the range.
        assert f"from 1 to {2**53 - 1}" in err.value.detail


@pytest.mark.parametrize(("amount", "value"), [(1, 1), (2**53 - 1, 2**53 - 1), (5e4, 50_000)])
def test_integer_amounts_pass(amount: object, value: int) -> None:
    assert validation.order_amount({"orderAmount": amount}) == value


@pytest.mark.parametrize(
    ("raw", "value"), [(None, 100), ("1", 1), ("500", 500), ("0", None), ("501", None),
                       ("abc", None), ("", None), ("-1", None), ("١٢", None)]
)  # fmt: skip
def test_limit(raw: str | None, value: int | None) -> None:
    if value is None:
        assert refused(validation.limit, raw) == (400, "INVALID_LIMIT")
    else:
        assert validation.limit(raw) == value
