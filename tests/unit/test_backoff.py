"""The one retry delay every loop uses (flashcoupon_common.backoff)."""

from __future__ import annotations

import pytest
from flashcoupon_common.backoff import backoff_delay


def test_backoff_grows_is_capped_and_never_zero() -> None:
    lo = [backoff_delay(a, base=0.1, cap=5, rand=lambda: 0.0) for a in range(12)]
    hi = [backoff_delay(a, base=0.1, cap=5, rand=lambda: 1.0) for a in range(12)]
    assert lo[0] == pytest.approx(0.05) and hi[0] == pytest.approx(0.1)
    assert hi[3] == pytest.approx(0.8)
    assert max(hi) == pytest.approx(5) and max(lo) == pytest.approx(2.5)
    assert hi == sorted(hi)
    assert backoff_delay(10_000, base=0.1, cap=5, rand=lambda: 1.0) == pytest.approx(5)
