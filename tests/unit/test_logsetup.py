"""RepeatFilter: a Kafka outage's repeated connection errors become a few lines with counts."""

from __future__ import annotations

import logging

from flashcoupon_common.logsetup import RepeatFilter, configure_logging


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def record(msg: str, *args: object, name: str = "aiokafka.conn", level: int = logging.ERROR):
    return logging.LogRecord(name, level, __file__, 1, msg, args, None)


CONNECT = "Unable connect to node with id %s: %s"


def test_a_30_s_outage_is_a_few_lines_that_account_for_every_repeat() -> None:
    clock = Clock()
    f = RepeatFilter(every_seconds=10, clock=clock)
    passed = []
    for i in range(870):  # what one persister logged in a 30 s Kafka outage
        r = record(CONNECT, i % 3, "[Errno 111] Connect call failed")
        if f.filter(r):
            passed.append(r.getMessage())
        clock.now += 30 / 870
    assert 2 <= len(passed) <= 4, passed
    assert passed[0] == "Unable connect to node with id 0: [Errno 111] Connect call failed"
    # Nothing vanishes: the first line, the summaries' counts and the repeats still pending
    # (reported when the next run starts) add up to every record.
    summarised = sum(int(m.split("[")[-1].split()[0]) for m in passed[1:])
    (run,) = f._runs.values()
    assert 1 + summarised + run.suppressed == 870


def test_a_new_message_passes_at_once_and_a_new_run_reports_the_last_one() -> None:
    clock = Clock()
    f = RepeatFilter(every_seconds=10, clock=clock)
    assert f.filter(record(CONNECT, 1, "refused"))
    assert not f.filter(record(CONNECT, 2, "refused"))
    assert f.filter(record("Unable to update metadata from [%s]", 1))  # another state
    assert not f.filter(record(CONNECT, 1, "refused"))
    clock.now += 11  # quiet: the run ended (Kafka came back), then it fails again
    again = record(CONNECT, 1, "refused")
    assert f.filter(again)
    assert again.getMessage().endswith("[the previous run ended with 2 more similar lines]")


def test_other_loggers_and_info_lines_are_never_folded() -> None:
    f = RepeatFilter(every_seconds=10, clock=Clock())
    for _ in range(5):
        assert f.filter(record("batch failed: %s", "x", name="flashcoupon_persister.service"))
        assert f.filter(record("joined group", level=logging.INFO))


def test_configure_logging_installs_the_filter() -> None:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        configure_logging("test")
        assert any(isinstance(x, RepeatFilter) for x in root.handlers[0].filters)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
