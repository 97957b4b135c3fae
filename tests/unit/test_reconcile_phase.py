"""The lifecycle phase as a function of spec, runtime state and time."""

from __future__ import annotations

from datetime import timedelta

import pytest
from flashcoupon_operator.reconcile import phase, seconds_to_opening

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


def test_opening_between_two_ticks_is_waited_for() -> None:
    # startAt 0.4 s away with a 1 s refresh: the next tick would come after the doors open.
    assert seconds_to_opening(START - timedelta(seconds=0.4), START, 1.0) == 0.4
    # One tick away, or a little more: the next tick comes an interval after this one ends,
    # and late on a busy box, so it may come after the doors open too.
    assert seconds_to_opening(START - timedelta(seconds=1), START, 1.0) == 1.0
    assert seconds_to_opening(START - timedelta(seconds=1.3), START, 1.0) == 1.3


@pytest.mark.parametrize(
    "now",
    [
        START - timedelta(seconds=2),  # two ticks away: the next tick reads it in time
        START - timedelta(seconds=30),
        START,  # open already: the tick reads Active (or SoldOut) itself
        START + timedelta(seconds=0.1),
    ],
)
def test_no_wait_unless_the_opening_falls_before_the_next_tick(now: object) -> None:
    assert seconds_to_opening(now, START, 1.0) is None  # type: ignore[arg-type]
