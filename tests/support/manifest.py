"""CouponEvent manifests for the operator tests: the CRD's schema, a valid base and variants."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml
from flashcoupon_operator.manifest import (
    ManifestError,
    parse_manifest,
)

from tests.support.paths import ROOT

CRD = yaml.safe_load((ROOT / "k8s/crd/couponevents.flashcoupon.io.yaml").read_text())
VERSION = CRD["spec"]["versions"][0]
SCHEMA = VERSION["schema"]["openAPIV3Schema"]
# A manifest(...) value that deletes the field instead of setting it.
DELETE = object()

BASE: dict[str, Any] = {
    "apiVersion": "flashcoupon.io/v1alpha1",
    "kind": "CouponEvent",
    "metadata": {"name": "bf-2026", "namespace": "shop", "labels": {"team": "growth"}},
    "spec": {
        "title": "Black Friday",
        "quantity": 10_000,
        "perUserLimit": 1,
        "startAt": "2026-11-27T14:00:00+09:00",
        "endAt": "2026-11-27T23:59:59+09:00",
        "warmup": "10m",
        "coupon": {"validFor": "720h"},
        "tiers": [
            {"name": "big", "discount": {"type": "fixed", "amount": 10_000}, "share": 10},
            {
                "name": "small",
                "discount": {"type": "percent", "percent": 5, "maxAmount": 3000},
                "share": 90,
            },
        ],
    },
}


def manifest(**spec_changes: Any) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    for key, value in spec_changes.items():
        if value is DELETE:
            del doc["spec"][key]
        else:
            doc["spec"][key] = value
    return doc


def errors_of(doc: Any) -> list[str]:
    with pytest.raises(ManifestError) as info:
        parse_manifest(doc)
    return [str(e) for e in info.value.errors]
