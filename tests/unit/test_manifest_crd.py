"""The CouponEvent CRD: its structure, and that it agrees with manifest.py on the examples.

The CRD's openAPIV3Schema is checked by a small evaluator of the keywords it uses (type,
required, enum, bounds, pattern, list-map keys), so every example in k8s/examples/ is accepted
by both the CRD schema and `couponctl validate`, and known-bad manifests are refused by both.
CEL rules cannot be evaluated here; their presence and the fields they reference are checked.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
from flashcoupon_operator.manifest import (
    MAX_PER_USER_LIMIT,
    MAX_QUANTITY,
    ManifestError,
    load_documents,
    parse_manifest,
    parse_manifests,
)

from tests.support.manifest import CRD, SCHEMA, VERSION

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "k8s/examples").glob("*.yaml"))
SPEC = SCHEMA["properties"]["spec"]
DATE_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")
TYPES = {
    "object": dict,
    "array": list,
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
}


def schema_errors(value: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """The openAPIV3Schema keywords the CRD uses, evaluated the way the API server does."""
    kind = schema.get("type")
    if kind and (
        not isinstance(value, TYPES[kind]) or (kind != "boolean" and isinstance(value, bool))
    ):
        return [f"{path}: not {kind}"]
    errs: list[str] = []
    if "enum" in schema and value not in schema["enum"]:
        errs.append(f"{path}: not in enum")
    if isinstance(value, int | float) and not isinstance(value, bool):
        low = schema.get("minimum")
        if low is not None and (value < low or (schema.get("exclusiveMinimum") and value == low)):
            errs.append(f"{path}: below minimum")
        if schema.get("maximum") is not None and value > schema["maximum"]:
            errs.append(f"{path}: above maximum")
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0) or len(value) > schema.get("maxLength", 1e9):
            errs.append(f"{path}: length")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errs.append(f"{path}: pattern")
        if schema.get("format") == "date-time" and not DATE_TIME.match(value):
            errs.append(f"{path}: not date-time")
    if isinstance(value, dict):
        errs += [f"{path}.{k}: required" for k in schema.get("required", []) if k not in value]
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                errs += schema_errors(value[key], sub, f"{path}.{key}")
    if isinstance(value, list):
        if not schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", 1e9):
            errs.append(f"{path}: item count")
        keys = schema.get("x-kubernetes-list-map-keys")
        if keys:
            seen = [tuple(item.get(k) for k in keys) for item in value if isinstance(item, dict)]
            if len(seen) != len(set(seen)):
                errs.append(f"{path}: duplicate list-map key")
        for i, item in enumerate(value):
            errs += schema_errors(item, schema.get("items", {}), f"{path}[{i}]")
    return errs


def test_crd_identity_and_versions() -> None:
    assert CRD["apiVersion"] == "apiextensions.k8s.io/v1"
    assert CRD["metadata"]["name"] == "couponevents.flashcoupon.io"
    assert CRD["spec"]["group"] == "flashcoupon.io"
    assert CRD["spec"]["scope"] == "Namespaced"
    assert CRD["spec"]["names"]["kind"] == "CouponEvent"
    assert CRD["spec"]["names"]["plural"] == "couponevents"
    assert [(v["name"], v["served"], v["storage"]) for v in CRD["spec"]["versions"]] == [
        ("v1alpha1", True, True)
    ]
    assert VERSION["subresources"] == {"status": {}}


def test_printer_columns() -> None:
    cols = {c["name"]: c["jsonPath"] for c in VERSION["additionalPrinterColumns"]}
    assert cols == {
        "Phase": ".status.phase",
        "Quantity": ".spec.quantity",
        "Issued": ".status.issued",
        "Remaining": ".status.remaining",
        "Persisted": ".status.persisted",
        "Start": ".spec.startAt",
        "Age": ".metadata.creationTimestamp",
    }


def test_status_is_declared_so_kopf_patches_are_not_pruned() -> None:
    status = SCHEMA["properties"]["status"]
    assert {"phase", "issued", "remaining", "persisted", "observedGeneration", "conditions"} <= set(
        status["properties"]
    )
    assert status["properties"]["phase"]["enum"] == [
        "Pending",
        "Preloading",
        "Ready",
        "Active",
        "SoldOut",
        "Ended",
        "Failed",
    ]
    assert status["x-kubernetes-preserve-unknown-fields"] is True


def test_cel_rules_cover_shares_window_and_quantity() -> None:
    rules = [r["rule"] for r in SPEC["x-kubernetes-validations"]]
    assert "self.tiers.map(t, t.share).sum() == 100" in rules
    assert "self.endAt > self.startAt" in rules
    assert "self.quantity > 0" in rules
    # CEL compares these as timestamps only because the fields are format: date-time.
    assert SPEC["properties"]["startAt"]["format"] == "date-time"
    assert SPEC["properties"]["endAt"]["format"] == "date-time"


def test_schema_bounds_match_the_manifest_rules() -> None:
    props = SPEC["properties"]
    assert props["quantity"]["maximum"] == MAX_QUANTITY
    assert props["perUserLimit"]["maximum"] == MAX_PER_USER_LIMIT
    assert props["perUserLimit"]["default"] == 1
    tier = props["tiers"]["items"]["properties"]
    assert (tier["share"]["minimum"], tier["share"]["maximum"]) == (1, 100)
    assert tier["discount"]["properties"]["type"]["enum"] == ["fixed", "percent"]
    assert props["warmup"]["default"] == "10m" and props["coupon"]["properties"]["validFor"][
        "default"
    ] == ("720h")


def test_there_are_examples() -> None:
    names = {p.name for p in EXAMPLES}
    assert {"black-friday.yaml", "demo-drop.yaml"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_is_valid_for_manifest_and_crd(path: Path) -> None:
    text = path.read_text()
    specs = parse_manifests(text)
    assert specs
    for doc in load_documents(text):
        assert schema_errors(doc, SCHEMA) == []


def test_black_friday_example_is_the_design_example() -> None:
    (spec,) = parse_manifests((ROOT / "k8s/examples/black-friday.yaml").read_text())
    assert spec.quantity == 10_000
    assert spec.tier_quantities() == {"big": 1_000, "small": 9_000}


BAD = [
    ("perUserLimit", 0),
    ("quantity", 0),
    ("quantity", MAX_QUANTITY + 1),
    ("warmup", "10 minutes"),
    ("startAt", "2026-11-27T14:00:00"),
    ("tiers", []),
    ("tiers", [{"name": "a", "share": 0, "discount": {"type": "fixed", "amount": 1}}]),
    ("tiers", [{"name": "A", "share": 100, "discount": {"type": "fixed", "amount": 1}}]),
    ("tiers", [{"name": "a", "share": 100, "discount": {"type": "bogo"}}]),
    ("tiers", [{"name": "a", "share": 100, "discount": {"type": "fixed", "amount": 0}}]),
    ("tiers", [{"name": "a", "share": 100, "discount": {"type": "percent", "percent": 101}}]),
    (
        "tiers",
        [
            {"name": "a", "share": 50, "discount": {"type": "fixed", "amount": 1}},
            {"name": "a", "share": 50, "discount": {"type": "fixed", "amount": 1}},
        ],
    ),
    ("admission", {"perUser": {"perSecond": 0}}),
]


@pytest.mark.parametrize(("field", "value"), BAD, ids=[f"{f}={v!r}"[:40] for f, v in BAD])
def test_bad_values_are_refused_by_both(field: str, value: Any) -> None:
    (doc,) = load_documents((ROOT / "k8s/examples/black-friday.yaml").read_text())
    doc = copy.deepcopy(doc)
    doc["spec"][field] = value
    assert schema_errors(doc, SCHEMA), "the CRD schema accepted it"
    with pytest.raises(ManifestError):
        parse_manifest(doc)


CRDCHECK_BAD = sorted((ROOT / "k8s/tools/crdcheck/testdata").glob("bad-*.yaml"))


@pytest.mark.parametrize("path", CRDCHECK_BAD, ids=lambda p: p.name)
def test_what_the_api_server_refuses_couponctl_refuses_too(path: Path) -> None:
    # k8s/tools/crdcheck.sh shows the API server's validation refuses each of these files.
    with pytest.raises(ManifestError):
        parse_manifests(path.read_text())


def test_there_are_api_server_fixtures() -> None:
    assert len(CRDCHECK_BAD) >= 7
