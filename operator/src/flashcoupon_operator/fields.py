"""Field-level parsing for manifests: RFC 3339 times, Go-style durations, bounded integers.

Each parser returns `(value, problem)` instead of raising, so the manifest validator can
collect every problem in a document rather than stopping at the first.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

# RFC 3339 date-time with a mandatory offset (Z or ±hh:mm); fractional seconds allowed.
RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$")
# Go/Kubernetes-style duration restricted to hours, minutes, seconds: 720h, 1h30m, 45s.
DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
DURATION_HINT = "a duration like 10m, 720h, 1h30m or 45s"


def parse_rfc3339(raw: Any) -> tuple[datetime | None, str | None]:
    example = "e.g. 2026-11-27T14:00:00+09:00"
    if not isinstance(raw, str):
        return None, f"must be an RFC 3339 timestamp string with offset ({example})"
    if not RFC3339.fullmatch(raw):
        return None, f"{raw!r} is not RFC 3339 with an offset ({example})"
    text = raw.upper()
    # datetime.fromisoformat takes at most 6 fractional digits; RFC 3339 allows more.
    m = re.match(r"^(.*\.\d{6})\d+(.*)$", text)
    if m:
        text = m.group(1) + m.group(2)
    try:
        return datetime.fromisoformat(text), None
    except ValueError as exc:
        return None, f"{raw!r} is not a valid date-time ({exc})"


def parse_duration(raw: Any, *, allow_zero: bool) -> tuple[timedelta | None, str | None]:
    if not isinstance(raw, str) or not raw:
        return None, f"must be {DURATION_HINT}"
    m = DURATION.fullmatch(raw)
    if not m:
        return None, f"{raw!r} is not {DURATION_HINT}"
    h, mi, s = (int(g) if g else 0 for g in m.groups())
    value = timedelta(hours=h, minutes=mi, seconds=s)
    if not allow_zero and value <= timedelta(0):
        return None, "must be longer than zero"
    return value, None


class Errors:
    """Collects (path, message) pairs while a document is validated."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str]] = []

    def __bool__(self) -> bool:
        return bool(self.items)

    def add(self, path: str, message: str) -> None:
        self.items.append((path, message))

    def int_in(
        self,
        obj: Mapping[str, Any],
        key: str,
        path: str,
        low: int,
        high: int | None,
        *,
        required: bool = False,
    ) -> int | None:
        """obj[key] as an int in [low, high]; None (and an error if required) when absent."""
        if key not in obj or obj[key] is None:
            if required:
                self.add(path, "is required")
            return None
        value = obj[key]
        bound = f"{low:,}..{high:,}" if high is not None else f"≥ {low:,}"
        # bool is an int subclass in Python; `true` is not a quantity.
        if isinstance(value, bool) or not isinstance(value, int):
            self.add(path, f"must be an integer {bound}, got {value!r}")
            return None
        if value < low or (high is not None and value > high):
            self.add(path, f"must be an integer {bound}, got {value:,}")
            return None
        return value

    def number_above_zero(self, obj: Mapping[str, Any], key: str, path: str) -> float | None:
        if key not in obj or obj[key] is None:
            return None
        value = obj[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
            self.add(path, f"must be a number > 0, got {value!r}")
            return None
        return float(value)
