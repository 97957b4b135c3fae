"""The error a request operation raises to be answered as problem+json (RFC 9457).

Plain Python on purpose: decision modules (validation, redemption rules) raise it without
importing a web framework; flashcoupon_common.http translates it at the edge.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class ProblemError(Exception):
    """An error answered to the client as problem+json."""

    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        *,
        headers: Mapping[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.headers = dict(headers or {})
        self.extra = extra
