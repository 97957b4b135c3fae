"""The lifecycle phase as a function of spec, runtime state and time."""

from __future__ import annotations

from datetime import timedelta

import pytest
from flashcoupon_operator.reconcile import phase

from tests.support.reconcile import AFTER, BEFORE, DURING, END, START, WARMING, State, spec


@pytest.mark.parametrize(
    ("now", "expected"),
    [(BEFORE, "Pending"), (WARMING, "Preloading"), (DURING, "Preloading"), (AFTER, "Ended")],
)
def test_without_runtime_state(now: object, expected: str) -> None:
    assert phase(spec(), None, now) == expected  # type: ignore[arg-type]


def test_warmup_boundary_is_inclusive() -> None:
    due = START - timedelta(minutes=10)
    assert phase(spec(), None, due - timedelta(microseconds=1)) == "Pending"
    assert phase(spec(), None, due) == "Preloading"


def test_preloaded_before_start_is_ready_then_active_on_the_second() -> None:
    assert phase(spec(), State(), START - timedelta(microseconds=1)) == "Ready"
    assert phase(spec(), State(), START) == "Active"


def test_sold_out_then_ended() -> None:
    done = State(issued=1000)
    assert phase(spec(), done, DURING) == "SoldOut"
    assert phase(spec(), done, END) == "Ended"
    assert phase(spec(), State(issued=10), END) == "Ended"


def test_incomplete_preload_is_preloading() -> None:
    assert phase(spec(), State(), DURING, preloaded=False) == "Preloading"


def test_failed_wins() -> None:
    assert phase(spec(), State(), DURING, failed=True) == "Failed"


def test_runtime_window_wins_over_spec() -> None:
    # The script enforces the window in Redis; a spec not yet applied does not open the doors.
    moved = State(start_at=START + timedelta(hours=1))
    assert phase(spec(), moved, DURING) == "Ready"


def test_paused_does_not_change_the_phase() -> None:
    assert phase(spec(), State(paused=True), DURING) == "Active"
