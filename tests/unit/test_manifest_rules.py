"""Every manifest rule: one valid base manifest, one mutation per rule, the exact path reported."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from flashcoupon_common.event_spec import AdmissionSpec
from flashcoupon_common.messages import Discount
from flashcoupon_operator.manifest import ManifestError, parse_manifest

from tests.support.manifest import DELETE, errors_of, manifest


def test_valid_manifest_becomes_event_spec() -> None:
    spec = parse_manifest(manifest())
    assert spec.event_id == "bf-2026"
    assert spec.quantity == 10_000
    assert spec.start_at == datetime(2026, 11, 27, 5, tzinfo=UTC)
    assert spec.start_at.utcoffset() == timedelta(hours=9)
    assert spec.warmup == timedelta(minutes=10)
    assert spec.valid_for == timedelta(hours=720)
    assert spec.tiers[1].discount == Discount("percent", percent=5, max_amount=3000)
    assert spec.tier_quantities() == {"big": 1000, "small": 9000}


def test_defaults_apply_when_optional_fields_are_absent() -> None:
    doc = manifest(perUserLimit=DELETE, warmup=DELETE, coupon=DELETE, title=DELETE)
    spec = parse_manifest(doc)
    assert spec.per_user_limit == 1
    assert spec.warmup == timedelta(minutes=10)
    assert spec.valid_for == timedelta(hours=720)
    assert spec.title == "bf-2026"
    assert spec.admission == AdmissionSpec()


@pytest.mark.parametrize(
    ("name", "ok"),
    [
        ("a", True),
        ("black-friday-2026", True),
        ("x" * 63, True),
        ("x" * 64, False),
        ("Black-Friday", False),
        ("-lead", False),
        ("trail-", False),
        ("under_score", False),
        ("dot.ted", False),
    ],
)
def test_name_must_be_dns1123_label(name: str, ok: bool) -> None:
    doc = manifest()
    doc["metadata"]["name"] = name
    if ok:
        assert parse_manifest(doc).event_id == name
    else:
        assert any(e.startswith("metadata.name: ") for e in errors_of(doc))


def test_missing_metadata_name() -> None:
    doc = manifest(title=DELETE)
    del doc["metadata"]["name"]
    assert errors_of(doc) == ["metadata.name: is required"]


def test_api_version_and_kind_are_checked() -> None:
    doc = manifest()
    doc["apiVersion"] = "flashcoupon.io/v1"
    doc["kind"] = "Coupon"
    errs = errors_of(doc)
    assert errs[0].startswith("apiVersion: must be flashcoupon.io/v1alpha1")
    assert errs[1].startswith("kind: must be CouponEvent")


@pytest.mark.parametrize("value", [0, -5, 10_000_001, "100", 1.5, True, None])
def test_quantity_is_an_integer_in_range(value: Any) -> None:
    errs = errors_of(manifest(quantity=value))
    assert len(errs) == 1 and errs[0].startswith("spec.quantity: ")


def test_quantity_is_required_and_upper_bound_is_inclusive() -> None:
    assert errors_of(manifest(quantity=DELETE)) == ["spec.quantity: is required"]
    assert parse_manifest(manifest(quantity=10_000_000)).quantity == 10_000_000


@pytest.mark.parametrize(("value", "ok"), [(1, True), (100, True), (0, False), (101, False)])
def test_per_user_limit_range(value: int, ok: bool) -> None:
    if ok:
        assert parse_manifest(manifest(perUserLimit=value)).per_user_limit == value
    else:
        assert errors_of(manifest(perUserLimit=value))[0].startswith("spec.perUserLimit: ")


@pytest.mark.parametrize(
    "value",
    [
        "2026-11-27T14:00:00",  # no offset
        "2026-11-27 14:00:00+09:00",  # space instead of T
        "2026-11-27",
        "tomorrow",
        "2026-13-27T14:00:00Z",  # month 13
        1764219600,
    ],
)
def test_start_at_must_be_rfc3339_with_offset(value: Any) -> None:
    errs = errors_of(manifest(startAt=value))
    assert len(errs) == 1 and errs[0].startswith("spec.startAt: "), errs


def test_unquoted_yaml_timestamps_are_validated_as_text() -> None:
    from flashcoupon_operator.manifest import parse_manifests

    text = (
        "apiVersion: flashcoupon.io/v1alpha1\nkind: CouponEvent\nmetadata: {name: x}\n"
        "spec:\n  quantity: 5\n  startAt: 2026-11-27T14:00:00\n  endAt: 2026-11-28T00:00:00Z\n"
        "  tiers: [{name: a, share: 100, discount: {type: fixed, amount: 1}}]\n"
    )
    with pytest.raises(ManifestError) as info:
        parse_manifests(text)
    assert [e.path for e in info.value.errors] == ["spec.startAt"]


def test_times_accept_z_fraction_and_offsets() -> None:
    spec = parse_manifest(
        manifest(startAt="2026-11-27T05:00:00.123456789Z", endAt="2026-11-27T06:00:00-03:30")
    )
    assert spec.start_at == datetime(2026, 11, 27, 5, 0, 0, 123456, tzinfo=UTC)
    assert spec.end_at.utcoffset() == -timedelta(hours=3, minutes=30)
    assert spec.end_at.tzinfo == timezone(-timedelta(hours=3, minutes=30))


@pytest.mark.parametrize("end", ["2026-11-27T14:00:00+09:00", "2026-11-27T13:00:00+09:00"])
def test_end_at_must_be_after_start_at(end: str) -> None:
    assert errors_of(manifest(endAt=end)) == ["spec.endAt: must be after spec.startAt"]


def test_end_after_start_compares_instants_not_text() -> None:
    # 05:30Z is after 14:00+09:00 (= 05:00Z) although its text sorts earlier.
    spec = parse_manifest(manifest(endAt="2026-11-27T05:30:00Z"))
    assert spec.end_at - spec.start_at == timedelta(minutes=30)


def test_missing_times_are_reported() -> None:
    errs = errors_of(manifest(startAt=DELETE, endAt=DELETE))
    assert [e.split(":")[0] for e in errs] == ["spec.startAt", "spec.endAt"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("10m", timedelta(minutes=10)),
        ("720h", timedelta(hours=720)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("45s", timedelta(seconds=45)),
        ("1h0m5s", timedelta(hours=1, seconds=5)),
        ("0s", timedelta(0)),
    ],
)
def test_warmup_durations(text: str, expected: timedelta) -> None:
    assert parse_manifest(manifest(warmup=text)).warmup == expected


@pytest.mark.parametrize("text", ["10", "1d", "m10", "10 m", "", "1.5h", 600, "30m1h"])
def test_bad_durations_name_the_field(text: Any) -> None:
    errs = errors_of(manifest(warmup=text))
    assert len(errs) == 1 and errs[0].startswith("spec.warmup: ")


def test_valid_for_must_be_positive_and_known_fields_only() -> None:
    errs = errors_of(manifest(coupon={"validFor": "0s", "days": 3}))
    assert errs == [
        "spec.coupon.days: unknown field",
        "spec.coupon.validFor: must be longer than zero",
    ]


def test_unknown_spec_field_is_an_error() -> None:
    assert errors_of(manifest(perUserLimt=2)) == ["spec.perUserLimt: unknown field"]


def test_spec_must_be_a_mapping_and_document_too() -> None:
    doc = manifest()
    doc["spec"] = ["quantity", 5]
    assert errors_of(doc) == ["spec: is required and must be a mapping"]
    assert errors_of(["not", "a", "mapping"]) == [
        "(document): must be a mapping (a CouponEvent object)"
    ]


@pytest.mark.parametrize("title", ["", "   ", 42, "x" * 256])
def test_title_rule(title: Any) -> None:
    assert errors_of(manifest(title=title))[0].startswith("spec.title: ")
