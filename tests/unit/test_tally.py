"""Tallies expose exactly what prometheus_client's Counter and Histogram expose for the same
records (flashcoupon_common.tally)."""

from __future__ import annotations

import re
import threading

import pytest
from flashcoupon_common.tally import CounterTally, HistogramTally
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)
# Values on, between, below and above the bounds: `le` is inclusive.
VALUES = (0.0, 0.0005, 0.001, 0.0011, 0.0025, 0.003, 0.05, 0.7, 5.0, 5.5, 120.0)


def _without_created(text: bytes) -> str:
    # The creation instants differ between the two registries; every other line must match.
    return re.sub(r"(_created\{[^}]*\}) \S+", r"\1 T", text.decode())


def _pair() -> tuple[CollectorRegistry, CollectorRegistry]:
    return CollectorRegistry(), CollectorRegistry()


@pytest.mark.parametrize("render", [generate_latest, generate_openmetrics])
def test_a_counter_tally_exposes_what_a_counter_exposes(render) -> None:  # type: ignore[no-untyped-def]
    ours, theirs = _pair()
    tally = CounterTally("t_requests_total", "Requests", ["route", "status"], registry=ours)
    counter = Counter("t_requests_total", "Requests", ["route", "status"], registry=theirs)
    records = [("/a", "200"), ("/a", "200"), ("/b", "503"), ("/a", "404")]
    for i, (route, status) in enumerate(records):
        tally.labels(route, status).inc()
        counter.labels(route, status).inc()
        if i == 0:
            tally.labels(route, status).inc(2.5)
            counter.labels(route, status).inc(2.5)
    tally.labels("/never", "200")  # a series exported at 0, as labels() alone does
    counter.labels("/never", "200")
    assert _without_created(render(ours)) == _without_created(render(theirs))
    assert "_created" in render(ours).decode()


@pytest.mark.parametrize("render", [generate_latest, generate_openmetrics])
def test_a_histogram_tally_exposes_what_a_histogram_exposes(render) -> None:  # type: ignore[no-untyped-def]
    ours, theirs = _pair()
    tally = HistogramTally("t_seconds", "Durations", ["service"], BUCKETS, registry=ours)
    histogram = Histogram("t_seconds", "Durations", ["service"], buckets=BUCKETS, registry=theirs)
    for v in VALUES:
        tally.labels("gw").observe(v)
        histogram.labels("gw").observe(v)
    tally.labels("idle")
    histogram.labels("idle")
    assert _without_created(render(ours)) == _without_created(render(theirs))
    text = render(ours).decode()
    assert 't_seconds_bucket{le="0.001",service="gw"} 3.0' in text  # 0, 0.0005 and 0.001
    assert 't_seconds_count{service="gw"} 11.0' in text


def test_removed_series_are_gone_and_others_stay() -> None:
    registry = CollectorRegistry()
    tally = CounterTally("t_issued_total", "Issued", ["event", "outcome"], registry=registry)
    tally.labels("ev-a", "ISSUED").inc()
    tally.labels("ev-b", "ISSUED").inc(3)
    tally.remove("ev-a", "ISSUED")
    issued = registry.get_sample_value
    assert issued("t_issued_total", {"event": "ev-a", "outcome": "ISSUED"}) is None
    assert issued("t_issued_total", {"event": "ev-b", "outcome": "ISSUED"}) == 3


def test_wrong_label_counts_and_negative_increments_are_refused() -> None:
    tally = CounterTally("t_x_total", "X", ["a", "b"], registry=None)
    with pytest.raises(ValueError, match="expected labels"):
        tally.labels("only-one")
    with pytest.raises(ValueError, match="non-negative"):
        tally.labels("1", "2").inc(-1)
    with pytest.raises(ValueError, match="increasing"):
        HistogramTally("t_h", "H", [], [1, 0.5], registry=None)


def test_a_name_registered_twice_is_refused_as_prometheus_client_refuses_it() -> None:
    registry = CollectorRegistry()
    CounterTally("t_dup_total", "X", [], registry=registry)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        Counter("t_dup_total", "X", registry=registry)


def test_a_scrape_during_observations_keeps_count_equal_to_the_inf_bucket() -> None:
    # A scrape from prometheus_client's own server thread reads while the loop records.
    registry = CollectorRegistry()
    tally = HistogramTally("t_race_seconds", "R", [], BUCKETS, registry=registry)
    series = tally.labels()
    done = threading.Event()

    def record() -> None:
        while not done.is_set():
            for v in VALUES:
                series.observe(v)

    writer = threading.Thread(target=record)
    writer.start()
    try:
        for _ in range(200):
            text = generate_latest(registry).decode()
            inf = re.search(r't_race_seconds_bucket\{le="\+Inf"\} (\S+)', text)
            count = re.search(r"t_race_seconds_count (\S+)", text)
            assert inf is not None and count is not None
            assert inf.group(1) == count.group(1)
    finally:
        done.set()
        writer.join()
