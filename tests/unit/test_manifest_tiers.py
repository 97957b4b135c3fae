"""Tier, discount and admission rules; collecting every error; multi-document files."""

from __future__ import annotations

from typing import Any

import pytest
from flashcoupon_common.event_spec import AdmissionSpec
from flashcoupon_operator.manifest import ManifestError, parse_manifest, parse_manifests

from tests.support.manifest import BASE, errors_of, manifest


def fixed(name: str, share: Any, amount: Any = 1000) -> dict[str, Any]:
    return {"name": name, "discount": {"type": "fixed", "amount": amount}, "share": share}


def test_tiers_must_be_a_non_empty_list() -> None:
    for value in ([], None, {"name": "a"}):
        assert errors_of(manifest(tiers=value)) == ["spec.tiers: must be a non-empty list of tiers"]


def test_share_must_be_integer_1_to_100_with_path() -> None:
    errs = errors_of(manifest(tiers=[fixed("a", 100), fixed("b", 0)]))
    assert errs == ["spec.tiers[1].share: must be an integer 1..100, got 0"]
    errs = errors_of(manifest(tiers=[fixed("a", 50.5), fixed("b", 49.5)]))
    assert [e.split(":")[0] for e in errs] == ["spec.tiers[0].share", "spec.tiers[1].share"]


def test_shares_must_sum_to_100() -> None:
    errs = errors_of(manifest(tiers=[fixed("a", 30), fixed("b", 60)]))
    assert errs == ["spec.tiers: shares must sum to 100, got 90"]


def test_tier_names_are_unique_labels() -> None:
    errs = errors_of(manifest(tiers=[fixed("a", 50), fixed("a", 50)]))
    assert errs == ["spec.tiers[1].name: duplicate tier name 'a'"]
    errs = errors_of(manifest(tiers=[fixed("Big Tier", 100)]))
    assert errs[0].startswith("spec.tiers[0].name: must be a DNS-1123 label")


def test_tier_unknown_field_and_non_mapping() -> None:
    tier = fixed("a", 100) | {"weight": 3}
    assert errors_of(manifest(tiers=[tier])) == ["spec.tiers[0].weight: unknown field"]
    errs = errors_of(manifest(tiers=["a"]))
    assert errs == ["spec.tiers[0]: must be a mapping {name, discount, share}"]


@pytest.mark.parametrize(
    ("discount", "path"),
    [
        ({"type": "fixed", "amount": 0}, "spec.tiers[0].discount.amount"),
        ({"type": "fixed", "amount": -10}, "spec.tiers[0].discount.amount"),
        ({"type": "fixed"}, "spec.tiers[0].discount.amount"),
        ({"type": "fixed", "amount": 5, "percent": 3}, "spec.tiers[0].discount.percent"),
        ({"type": "percent", "percent": 0}, "spec.tiers[0].discount.percent"),
        ({"type": "percent", "percent": 101}, "spec.tiers[0].discount.percent"),
        ({"type": "percent", "percent": 5, "maxAmount": 0}, "spec.tiers[0].discount.maxAmount"),
        ({"type": "percent", "percent": 5, "amount": 9}, "spec.tiers[0].discount.amount"),
        ({"type": "bogo"}, "spec.tiers[0].discount.type"),
        (None, "spec.tiers[0].discount"),
    ],
)
def test_discount_rules(discount: Any, path: str) -> None:
    tier = {"name": "a", "share": 100, "discount": discount}
    errs = errors_of(manifest(tiers=[tier]))
    assert len(errs) == 1 and errs[0].startswith(path + ": "), errs


def test_percent_without_cap_is_valid() -> None:
    tier = {"name": "a", "share": 100, "discount": {"type": "percent", "percent": 100}}
    spec = parse_manifest(manifest(tiers=[tier]))
    assert spec.tiers[0].discount.max_amount is None


def test_admission_values_and_defaults() -> None:
    spec = parse_manifest(
        manifest(
            admission={
                "maxPerSecond": 50_000,
                "perUser": {"perSecond": 0.5},
                "waitingRoom": {"enabled": True},
            }
        )
    )
    assert spec.admission == AdmissionSpec(
        max_per_second=50_000,
        per_user_per_second=0.5,
        per_user_burst=5,
        waiting_room_enabled=True,
        waiting_room_admit_per_second=2000,
    )


def test_admission_errors_name_their_paths() -> None:
    errs = errors_of(
        manifest(
            admission={
                "maxPerSecond": 0,
                "perUser": {"perSecond": -1, "burst": 0, "rate": 1},
                "waitingRoom": {"enabled": "yes", "admitPerSecond": 0},
                "queue": True,
            }
        )
    )
    assert sorted(e.split(":")[0] for e in errs) == [
        "spec.admission.maxPerSecond",
        "spec.admission.perUser.burst",
        "spec.admission.perUser.perSecond",
        "spec.admission.perUser.rate",
        "spec.admission.queue",
        "spec.admission.waitingRoom.admitPerSecond",
        "spec.admission.waitingRoom.enabled",
    ]


def test_every_error_is_collected_not_just_the_first() -> None:
    doc = manifest(
        quantity=0,
        perUserLimit=500,
        startAt="soon",
        warmup="10 minutes",
        tiers=[fixed("a", 30), fixed("a", 0, amount=0)],
    )
    doc["metadata"]["name"] = "Bad_Name"
    errs = errors_of(doc)
    paths = [e.split(":")[0] for e in errs]
    assert paths == [
        "metadata.name",
        "spec.quantity",
        "spec.perUserLimit",
        "spec.startAt",
        "spec.warmup",
        "spec.tiers[1].name",
        "spec.tiers[1].share",
        "spec.tiers[1].discount.amount",
    ]


def _yaml(name: str, quantity: int = 10) -> str:
    return (
        "apiVersion: flashcoupon.io/v1alpha1\nkind: CouponEvent\n"
        f"metadata: {{name: {name}}}\n"
        f"spec:\n  quantity: {quantity}\n"
        "  startAt: '2026-11-27T14:00:00Z'\n  endAt: '2026-11-27T15:00:00Z'\n"
        "  tiers: [{name: a, share: 100, discount: {type: fixed, amount: 1}}]\n"
    )


def test_multi_document_file_yields_every_event() -> None:
    specs = parse_manifests(_yaml("one") + "---\n" + _yaml("two", 20) + "---\n")
    assert [(s.event_id, s.quantity) for s in specs] == [("one", 10), ("two", 20)]


def test_multi_document_errors_say_which_document() -> None:
    with pytest.raises(ManifestError) as info:
        parse_manifests(_yaml("one", 0) + "---\n" + _yaml("two") + "---\n" + _yaml("t", -1))
    assert [str(e) for e in info.value.errors] == [
        "document 1: spec.quantity: must be an integer 1..10,000,000, got 0",
        "document 3: spec.quantity: must be an integer 1..10,000,000, got -1",
    ]


def test_same_name_twice_in_one_file_is_rejected() -> None:
    with pytest.raises(ManifestError) as info:
        parse_manifests(_yaml("one") + "---\n" + _yaml("one", 20))
    assert [str(e) for e in info.value.errors] == [
        "metadata.name: 'one' appears in more than one document"
    ]


def test_yaml_syntax_error_and_empty_file() -> None:
    with pytest.raises(ManifestError) as info:
        parse_manifests("spec: [unclosed\n")
    assert info.value.errors[0].path == "(yaml)"
    with pytest.raises(ManifestError) as info:
        parse_manifests("# only a comment\n")
    assert str(info.value) == "(file): contains no CouponEvent document"


def test_base_fixture_is_left_untouched() -> None:
    assert BASE["spec"]["quantity"] == 10_000
