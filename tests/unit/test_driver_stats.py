"""The load driver's report maths: percentiles, outcome counting, throughput, sell-out time."""

from __future__ import annotations

import math

import pytest
from flashcoupon_loadtest.stats import (
    ISSUED,
    Record,
    fairness,
    latency_summary,
    outcome_counts,
    outcomes_by_kind,
    percentile,
    retry_mismatches,
    sell_out_seconds,
    split_retry_mismatches,
    summarize,
    throughput,
    time_series,
)


def rec(
    t: float, lat: float, code: str = ISSUED, user: str = "u", kind: str = "first", coupon: str = ""
) -> Record:
    status = {ISSUED: 201, "SOLD_OUT": 410, "DUPLICATE": 409, "TIMEOUT": 0}.get(code, 400)
    return Record(t, lat, status, code, user, kind, coupon)


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 50) == 50
    assert percentile(values, 95) == 95
    assert percentile(values, 99) == 99
    assert percentile(values, 100) == 100
    assert percentile(values, 0) == 1
    assert percentile([7.0], 99) == 7
    assert math.isnan(percentile([], 50))


def test_latency_summary_in_milliseconds() -> None:
    lat = [0.001] * 98 + [0.050, 0.200]
    s = latency_summary(lat)
    assert s["p50"] == pytest.approx(1.0)
    assert s["p99"] == pytest.approx(50.0)
    assert s["max"] == pytest.approx(200.0)
    assert s["mean"] == pytest.approx((0.098 + 0.25) / 100 * 1000)


def test_outcome_counting_by_code_and_kind() -> None:
    records = [
        rec(0, 0.01, ISSUED, "a"),
        rec(0, 0.01, "SOLD_OUT", "b"),
        rec(0, 0.01, "SOLD_OUT", "c"),
        rec(0, 0.01, "DUPLICATE", "a", "dup"),
        rec(0, 0.01, ISSUED, "a", "retry"),
    ]
    assert outcome_counts(records) == {"SOLD_OUT": 2, ISSUED: 2, "DUPLICATE": 1}
    assert outcomes_by_kind(records) == {
        "dup": {"DUPLICATE": 1},
        "first": {"SOLD_OUT": 2, ISSUED: 1},
        "retry": {ISSUED: 1},
    }


def test_throughput_spans_first_start_to_last_answer() -> None:
    records = [rec(100.0, 0.5), rec(100.5, 0.5), rec(101.0, 1.0)]  # span 100.0 → 102.0
    assert throughput(records) == pytest.approx(1.5)
    assert throughput([]) == 0.0


def test_sell_out_is_the_answer_that_issued_the_last_coupon() -> None:
    records = [
        rec(10.0, 0.1, ISSUED, "a"),
        rec(10.0, 0.3, ISSUED, "b"),
        rec(10.1, 0.1, ISSUED, "a", "retry"),  # a replayed answer is not a new coupon
        rec(10.2, 0.1, "SOLD_OUT", "c"),
    ]
    assert sell_out_seconds(records, 2) == pytest.approx(0.3)
    assert sell_out_seconds(records, 3) is None  # only two coupons were answered


def test_fairness_is_max_over_median_over_the_run_and_within_each_phase() -> None:
    # Issuing phase: presses made before the last coupon's answer (at 10.0 + 0.3).
    issuing = [rec(10.0, 0.1, ISSUED, "a"), rec(10.0, 0.3, ISSUED, "b"), rec(10.1, 0.2, "SOLD_OUT")]
    sold_out = [rec(10.3 + i / 100, 0.01, "SOLD_OUT", f"s{i}") for i in range(9)]
    late = rec(10.4, 0.05, "SOLD_OUT", "late")
    timeout = rec(10.5, 5.0, "TIMEOUT", "gone")  # unanswered: not a latency
    fair = fairness([*issuing, *sold_out, late, timeout], sell_out_seconds(issuing, 2))
    assert fair["run"] == pytest.approx({"p50": 10.0, "max": 300.0, "ratio": 30.0})
    assert fair["issuing"] == pytest.approx({"p50": 200.0, "max": 300.0, "ratio": 1.5})
    assert fair["sold_out"] == pytest.approx({"p50": 10.0, "max": 50.0, "ratio": 5.0})
    assert set(fairness(issuing, None)) == {"run"}  # not sold out: no phases


def test_retry_mismatch_flags_a_replay_that_lost_its_coupon() -> None:
    records = [
        rec(0, 0.01, ISSUED, "a", coupon="C1"),
        rec(0, 0.01, ISSUED, "a", "retry", coupon="C1"),  # consistent
        rec(0, 0.01, ISSUED, "b", coupon="C2"),
        rec(0, 0.01, "DUPLICATE", "b", "retry"),  # wrong: the replay must return C2
        rec(0, 0.01, "SOLD_OUT", "c"),
        rec(0, 0.01, "SOLD_OUT", "c", "retry"),  # consistent: nothing was issued
    ]
    assert retry_mismatches(records) == [("b", "C2", "DUPLICATE")]


def test_retry_mismatches_split_contradictions_from_stale_sold_out() -> None:
    records = [
        rec(0, 0.01, ISSUED, "a", coupon="C1"),
        rec(0, 0.01, "SOLD_OUT", "a", "retry"),  # stale: another issuer, after the sell-out
        rec(0, 0.01, ISSUED, "b", coupon="C2"),
        rec(0, 0.01, ISSUED, "b", "retry", coupon="C9"),  # a second coupon: contradiction
        rec(0, 0.01, ISSUED, "c", coupon="C3"),
        Record(0, 0.01, 429, "RATE_LIMITED", "c", "retry"),  # no decision: not counted
        Record(0, 0.01, 0, "TIMEOUT", "c", "retry"),
    ]
    mismatches = retry_mismatches(records)
    contradicted, stale = split_retry_mismatches(mismatches)
    assert contradicted == [("b", "C2", "ISSUED C9")]
    assert stale == [("a", "C1", "SOLD_OUT")]
    summary = summarize(records)
    assert (summary["retry_contradictions"], summary["retry_stale_sold_out"]) == (1, 1)


def test_time_series_counts_answers_and_issued_per_bucket() -> None:
    records = [
        rec(0.0, 0.05),
        rec(0.0, 0.15),
        rec(0.0, 0.16, "SOLD_OUT"),
        rec(0.2, 0.05, "SOLD_OUT"),
    ]
    series = time_series(records, bucket=0.1)
    assert [b["answers"] for b in series] == [1, 2, 1]
    assert [b["issued"] for b in series] == [1, 2, 2]
    assert series[1]["p99_ms"] == pytest.approx(160.0)


def test_summarize_counts_timeouts_as_unanswered() -> None:
    records = [rec(0, 0.01, ISSUED, "a"), rec(0, 10.0, "TIMEOUT", "b")]
    s = summarize(records, quantity=1)
    assert s["requests"] == 2
    assert s["answered"] == 1
    assert s["latency_ms"]["max"] == pytest.approx(10.0)  # the timeout is not a latency sample
    assert s["sell_out_seconds"] == pytest.approx(0.01)
    assert s["outcomes"] == {ISSUED: 1, "TIMEOUT": 1}


def test_bench_table_picks_rates_latencies_and_ratios() -> None:
    from flashcoupon_loadtest.bench_all import interesting_leaves

    data = {
        "hello": {"rps": 1000, "p99_ms": 3.5, "host": "x", "ok": True},
        "ratio_issuer_to_hello": 0.7,
        "modes": [{"name": "naive", "rps": 300}],
        "rounds": [{"rps": 999}],  # per-round repeats of the summary stay out of the table
        "ratios_vs_hello": {"issuer": 0.6},  # a ratio named by its parent
    }
    assert interesting_leaves(data) == [
        ("hello.rps", 1000.0),
        ("hello.p99_ms", 3.5),
        ("ratio_issuer_to_hello", 0.7),
        ("modes[0:naive].rps", 300.0),
        ("ratios_vs_hello.issuer", 0.6),
    ]


def test_demo_drain_figures_from_pipeline_samples() -> None:
    from flashcoupon_loadtest.demo_report import all_persisted_at, persisted_after

    samples = [(1.0, 10, 5), (2.0, 20, 19), (3.0, 20, 20), (4.0, 20, 20)]  # (t, issued, rows)
    assert all_persisted_at(samples) == 3.0
    records = [rec(0.5, 0.1), rec(0.6, 0.2)]
    assert persisted_after({"sell_out_seconds": 1.5}, records, samples) == pytest.approx(1.0)
    assert persisted_after({"sell_out_seconds": None}, records, samples) is None
