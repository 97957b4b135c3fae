"""flashcoupon_common.heap: what the gateway and the issuer do to the collector after start-up."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
from flashcoupon_common import heap


@pytest.fixture
def collector() -> Iterator[None]:
    saved = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*saved)


def test_start_up_objects_leave_the_collector_and_young_passes_come_less_often(
    collector: None,
) -> None:
    built_at_start_up = [[n] for n in range(1_000)]  # containers: tracked by the collector
    frozen_before = gc.get_freeze_count()
    heap.settle_after_startup()
    assert gc.get_threshold() == (heap.YOUNG_THRESHOLD, 10, 10)
    assert heap.YOUNG_THRESHOLD > 700
    assert gc.get_freeze_count() >= frozen_before + len(built_at_start_up)
    tracked = {id(o) for o in gc.get_objects()}
    assert not any(id(o) in tracked for o in built_at_start_up)


def test_garbage_from_start_up_is_collected_not_frozen(collector: None) -> None:
    class Cycle:
        me: object

    cycle = Cycle()
    cycle.me = cycle
    collected = []
    gc.callbacks.append(lambda phase, info: collected.append(info.get("collected", 0)))
    try:
        del cycle
        heap.settle_after_startup()
    finally:
        gc.callbacks.pop()
    assert sum(collected) >= 1


def test_a_burst_process_makes_no_full_collection_however_much_it_keeps(collector: None) -> None:
    # A driver worker keeps a record per request; without the hold, the middle passes' count
    # reaches the full pass's threshold and the kept records make it run (and pause).
    passes: list[int] = []
    gc.callbacks.append(lambda phase, info: passes.append(info["generation"]))
    try:
        heap.hold_full_collections()
        kept = [[n] for n in range(200_000)]  # ~285 young passes at 700: ~28 middle ones
    finally:
        gc.callbacks.pop()
    assert len(kept) == 200_000
    assert 1 in passes
    assert 2 not in passes
