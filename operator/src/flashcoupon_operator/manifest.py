"""CouponEvent manifests (the YAML of the custom resource) → validated `EventSpec`s.

Every rule reports the field path it concerns (`spec.tiers[1].share: ...`) and validation goes on
after the first problem, so a platform team sees every mistake in one run. The rules mirror the
CRD's openAPIV3Schema and CEL rules (k8s/crd/), so `couponctl validate` and `kubectl apply`
accept the same manifests; the CLI is stricter in one way: unknown spec fields are errors (the
API server would silently prune a misspelt `perUserLimt`).

YAML timestamps are read as plain strings (the implicit timestamp resolver is removed) so that
`startAt: 2026-11-27T14:00:00` without an offset is rejected instead of becoming a naive datetime.

Over 300 lines on purpose: one small function per field of the CRD, kept together so that
this module can be read side by side with the CRD's schema it mirrors.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import yaml
from flashcoupon_common.event_spec import AdmissionSpec, EventSpec, TierSpec
from flashcoupon_common.messages import Discount
from flashcoupon_common.validation import DNS_LABEL

from flashcoupon_operator.fields import Errors, parse_duration, parse_rfc3339

API_VERSION = "flashcoupon.io/v1alpha1"
KIND = "CouponEvent"
MAX_QUANTITY = 10_000_000
MAX_PER_USER_LIMIT = 100
MAX_TITLE = 255  # coupon_events.title is VARCHAR(255)

SPEC_FIELDS = frozenset(
    {"title", "quantity", "perUserLimit", "startAt", "endAt", "warmup", "coupon", "tiers",
     "admission"}
)  # fmt: skip
DEFAULTS = AdmissionSpec()


@dataclass(frozen=True, slots=True)
class FieldError:
    path: str
    message: str
    document: int | None = None  # 1-based index in a multi-document file

    def __str__(self) -> str:
        where = f"document {self.document}: " if self.document is not None else ""
        return f"{where}{self.path}: {self.message}"


class ManifestError(ValueError):
    """The manifest is invalid; `errors` lists every problem found, each with its field path."""

    def __init__(self, errors: list[FieldError]) -> None:
        self.errors = errors
        super().__init__("; ".join(str(e) for e in errors))


class _StringTimestampLoader(yaml.SafeLoader):  # type: ignore[misc]  # PyYAML is untyped
    pass


# Drop the timestamp resolver: times must stay strings so the RFC 3339 rule sees what was typed.
_StringTimestampLoader.yaml_implicit_resolvers = {
    ch: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for ch, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def load_documents(text: str) -> list[Any]:
    """Every non-empty YAML document in `text`; a YAML syntax error is a ManifestError."""
    try:
        # A SafeLoader subclass: no arbitrary object construction.
        docs = list(yaml.load_all(text, Loader=_StringTimestampLoader))
    except yaml.YAMLError as exc:
        raise ManifestError([FieldError("(yaml)", str(exc).replace("\n", " "))]) from None
    return [d for d in docs if d is not None]


def parse_manifests(text: str) -> list[EventSpec]:
    """All CouponEvents of a (multi-document) YAML file, or a ManifestError listing every error."""
    docs = load_documents(text)
    if not docs:
        raise ManifestError([FieldError("(file)", "contains no CouponEvent document")])
    specs: list[EventSpec] = []
    errors: list[FieldError] = []
    several = len(docs) > 1
    for i, doc in enumerate(docs, start=1):
        try:
            specs.append(parse_manifest(doc))
        except ManifestError as exc:
            errors.extend(FieldError(e.path, e.message, i if several else None) for e in exc.errors)
    names = [s.event_id for s in specs]
    for name in sorted({n for n in names if names.count(n) > 1}):
        errors.append(FieldError("metadata.name", f"{name!r} appears in more than one document"))
    if errors:
        raise ManifestError(errors)
    return specs


def parse_manifest(doc: Any) -> EventSpec:
    """One CouponEvent object (already parsed YAML/JSON) → EventSpec, or ManifestError."""
    err = Errors()
    if not isinstance(doc, Mapping):
        err.add("(document)", "must be a mapping (a CouponEvent object)")
        raise ManifestError(_field_errors(err))
    if doc.get("apiVersion") != API_VERSION:
        err.add("apiVersion", f"must be {API_VERSION}, got {doc.get('apiVersion')!r}")
    if doc.get("kind") != KIND:
        err.add("kind", f"must be {KIND}, got {doc.get('kind')!r}")
    name = _name(err, doc.get("metadata"))
    spec = doc.get("spec")
    if not isinstance(spec, Mapping):
        err.add("spec", "is required and must be a mapping")
        raise ManifestError(_field_errors(err))
    for key in sorted(set(spec) - SPEC_FIELDS, key=str):
        err.add(f"spec.{key}", "unknown field")

    # Without a title the name stands in (a bad name is reported once, under metadata.name).
    title = spec.get("title", name or "-")
    if not isinstance(title, str) or not title.strip() or len(title) > MAX_TITLE:
        err.add("spec.title", f"must be a non-empty string of at most {MAX_TITLE} characters")
    quantity = err.int_in(spec, "quantity", "spec.quantity", 1, MAX_QUANTITY, required=True)
    limit = err.int_in(spec, "perUserLimit", "spec.perUserLimit", 1, MAX_PER_USER_LIMIT) or 1
    start = _time(err, spec, "startAt")
    end = _time(err, spec, "endAt")
    if start is not None and end is not None and end <= start:
        err.add("spec.endAt", "must be after spec.startAt")
    warmup = _duration(err, spec.get("warmup", "10m"), "spec.warmup", allow_zero=True)
    valid_for = _valid_for(err, spec.get("coupon"))
    tiers = _tiers(err, spec.get("tiers"))
    admission = _admission(err, spec.get("admission"))

    if err:
        raise ManifestError(_field_errors(err))
    assert name and quantity and start and end and warmup is not None and valid_for
    return EventSpec(
        event_id=name,
        title=str(title),
        quantity=quantity,
        start_at=start,
        end_at=end,
        tiers=tiers,
        per_user_limit=limit,
        warmup=warmup,
        valid_for=valid_for,
        admission=admission,
    )


def _field_errors(err: Errors) -> list[FieldError]:
    return [FieldError(path, msg) for path, msg in err.items]


def _name(err: Errors, metadata: Any) -> str | None:
    if not isinstance(metadata, Mapping):
        err.add("metadata", "is required and must be a mapping with a name")
        return None
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        err.add("metadata.name", "is required")
        return None
    if not DNS_LABEL.ok(name):
        err.add(
            "metadata.name",
            f"{name!r} must be a DNS-1123 label: at most 63 characters of lowercase letters, "
            "digits and '-', starting and ending with a letter or digit",
        )
        return None
    return name


def _time(err: Errors, spec: Mapping[str, Any], key: str) -> datetime | None:
    path = f"spec.{key}"
    if key not in spec:
        err.add(path, "is required (RFC 3339 with offset, e.g. 2026-11-27T14:00:00+09:00)")
        return None
    value, problem = parse_rfc3339(spec[key])
    if problem:
        err.add(path, problem)
    return value


def _duration(err: Errors, raw: Any, path: str, *, allow_zero: bool) -> timedelta | None:
    value, problem = parse_duration(raw, allow_zero=allow_zero)
    if problem:
        err.add(path, problem)
    return value


def _valid_for(err: Errors, coupon: Any) -> timedelta | None:
    if coupon is None:
        coupon = {}
    if not isinstance(coupon, Mapping):
        err.add("spec.coupon", "must be a mapping like {validFor: 720h}")
        return None
    for key in sorted(set(coupon) - {"validFor"}, key=str):
        err.add(f"spec.coupon.{key}", "unknown field")
    return _duration(err, coupon.get("validFor", "720h"), "spec.coupon.validFor", allow_zero=False)


def _tiers(err: Errors, raw: Any) -> tuple[TierSpec, ...]:
    if not isinstance(raw, list) or not raw:
        err.add("spec.tiers", "must be a non-empty list of tiers")
        return ()
    tiers: list[TierSpec] = []
    seen: set[str] = set()
    shares: list[int | None] = []
    for i, item in enumerate(raw):
        path = f"spec.tiers[{i}]"
        if not isinstance(item, Mapping):
            err.add(path, "must be a mapping {name, discount, share}")
            shares.append(None)
            continue
        for key in sorted(set(item) - {"name", "discount", "share"}, key=str):
            err.add(f"{path}.{key}", "unknown field")
        name = item.get("name")
        if not isinstance(name, str) or not DNS_LABEL.ok(name):
            err.add(f"{path}.name", "must be a DNS-1123 label (lowercase, digits, '-', ≤ 63)")
            name = None
        elif name in seen:
            err.add(f"{path}.name", f"duplicate tier name {name!r}")
        else:
            seen.add(name)
        share = err.int_in(item, "share", f"{path}.share", 1, 100, required=True)
        shares.append(share)
        discount = _discount(err, item.get("discount"), f"{path}.discount")
        if name and share and discount:
            tiers.append(TierSpec(name, discount, share))
    if all(s is not None for s in shares) and sum(s or 0 for s in shares) != 100:
        err.add("spec.tiers", f"shares must sum to 100, got {sum(s or 0 for s in shares)}")
    return tuple(tiers)


def _discount(err: Errors, raw: Any, path: str) -> Discount | None:
    if not isinstance(raw, Mapping):
        err.add(path, "is required: {type: fixed, amount} or {type: percent, percent, maxAmount}")
        return None
    kind = raw.get("type")
    if kind == "fixed":
        allowed = {"type", "amount"}
    elif kind == "percent":
        allowed = {"type", "percent", "maxAmount"}
    else:
        err.add(f"{path}.type", f"must be fixed or percent, got {kind!r}")
        return None
    for key in sorted(set(raw) - allowed, key=str):
        err.add(f"{path}.{key}", f"unknown field for a {kind} discount")
    if kind == "fixed":
        amount = err.int_in(raw, "amount", f"{path}.amount", 1, None, required=True)
        return Discount("fixed", amount=amount) if amount else None
    percent = err.int_in(raw, "percent", f"{path}.percent", 1, 100, required=True)
    cap = err.int_in(raw, "maxAmount", f"{path}.maxAmount", 1, None)
    return Discount("percent", percent=percent, max_amount=cap) if percent else None


def _admission(err: Errors, raw: Any) -> AdmissionSpec:
    if raw is None:
        return DEFAULTS
    if not isinstance(raw, Mapping):
        err.add("spec.admission", "must be a mapping")
        return DEFAULTS
    for key in sorted(set(raw) - {"maxPerSecond", "perUser", "waitingRoom"}, key=str):
        err.add(f"spec.admission.{key}", "unknown field")
    max_ps = err.int_in(raw, "maxPerSecond", "spec.admission.maxPerSecond", 1, None)
    with _section(err, raw, "perUser", {"perSecond", "burst"}) as per_user:
        per_second = err.number_above_zero(
            per_user, "perSecond", "spec.admission.perUser.perSecond"
        )
        burst = err.int_in(per_user, "burst", "spec.admission.perUser.burst", 1, None)
    with _section(err, raw, "waitingRoom", {"enabled", "admitPerSecond"}) as room:
        enabled = room.get("enabled", DEFAULTS.waiting_room_enabled)
        if not isinstance(enabled, bool):
            err.add("spec.admission.waitingRoom.enabled", "must be true or false")
            enabled = False
        admit = err.int_in(
            room, "admitPerSecond", "spec.admission.waitingRoom.admitPerSecond", 1, None
        )
    return AdmissionSpec(
        max_per_second=max_ps,
        per_user_per_second=DEFAULTS.per_user_per_second if per_second is None else per_second,
        per_user_burst=burst or DEFAULTS.per_user_burst,
        waiting_room_enabled=enabled,
        waiting_room_admit_per_second=admit or DEFAULTS.waiting_room_admit_per_second,
    )


@contextmanager
def _section(
    err: Errors, parent: Mapping[str, Any], key: str, allowed: set[str]
) -> Iterator[Mapping[str, Any]]:
    """A nested optional mapping of `spec.admission`; unknown keys are errors."""
    raw = parent.get(key) or {}
    path = f"spec.admission.{key}"
    if not isinstance(raw, Mapping):
        err.add(path, "must be a mapping")
        raw = {}
    for extra in sorted(set(raw) - allowed, key=str):
        err.add(f"{path}.{extra}", "unknown field")
    yield raw
