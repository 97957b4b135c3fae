"""Same-run comparisons: round order, medians per path, ratios against targets, the table."""

from __future__ import annotations

import pytest
from flashcoupon_loadtest.rounds import (
    DEFAULT_ROUNDS,
    Ratio,
    ceiling_rps,
    ratio_lines,
    ratios,
    round_orders,
    side,
    sides,
    table_lines,
)


def m(rps: float, cpu: float, p99: float = 10.0) -> dict[str, object]:
    return {"rps": rps, "p50_ms": 1.0, "p99_ms": p99, "cpu_us_per_request": {"gateway": cpu}}


def test_rounds_alternate_so_no_path_is_always_first() -> None:
    assert round_orders(["a", "b", "c"], 3) == [["a", "b", "c"], ["c", "b", "a"], ["a", "b", "c"]]
    assert round_orders(["a"], 0) == []


def test_side_takes_medians_over_rounds() -> None:
    s = side([m(100, 50, 9), m(300, 70, 30), m(200, 60, 11)])
    assert (s["rounds"], s["rps"], s["p99_ms"]) == (3, 200.0, 11.0)
    assert s["cpu_us_per_request"] == {"gateway": 60.0}
    with pytest.raises(ValueError):
        side([])


def test_side_keeps_the_median_slowest_answer_when_rounds_measured_it() -> None:
    rounds = [{**m(100, 50), "max_ms": x} for x in (40.0, 900.0, 55.0)]
    assert side(rounds)["max_ms"] == 55.0
    assert "max_ms" not in side([m(100, 50)])


def test_one_disturbed_round_does_not_move_the_default_figure() -> None:
    # A fresh gateway's first sold-out round once cost 83 us per answer, the others ~42 us:
    # with the default number of rounds the path's figure is a measured round, not their mean.
    normal = [m(24_000, 42.0) for _ in range(DEFAULT_ROUNDS - 1)]
    s = side([m(12_000, 83.0), *normal])
    assert (s["rps"], s["cpu_us_per_request"]) == (24_000, {"gateway": 42.0})


def test_ratios_only_for_measured_paths_with_targets() -> None:
    measured = sides({"hello": [m(1000, 30)], "soldout": [m(700, 90)], "gateway": [m(300, 140)]})
    got = ratios(
        measured,
        {
            "soldout/hello": Ratio("soldout", "hello", 0.70),
            "gateway/hello": Ratio("gateway", "hello"),
            "issuer/hello": Ratio("issuer", "hello", 0.60),  # issuer not measured: left out
        },
    )
    assert got == {
        "soldout/hello": {"value": 0.7, "target": 0.70, "met": True},
        "gateway/hello": {"value": 0.3, "target": None, "met": None},
    }
    zero = ratios(sides({"a": [m(1, 1)], "z": [m(0, 1)]}), {"a/z": Ratio("a", "z", 0.5)})
    assert zero["a/z"] == {"value": None, "target": 0.5, "met": None}


def test_ceiling_is_the_cores_shared_by_every_process_none_above_one_core() -> None:
    # hello-world: server 32.8 us + driver 34.5 us per request on 2 cores -> 29.6k req/s shared,
    # the server alone could do 30.5k on its core: the shared figure binds.
    assert ceiling_rps([32.8], 34.5, cpus=2) == pytest.approx(29717.7, abs=0.1)
    # One process over half the total: its single core binds, whatever the cores.
    assert ceiling_rps([100.0, 10.0], 10.0, cpus=2) == 10000.0
    assert ceiling_rps([100.0, 10.0], 10.0, cpus=8) == 10000.0
    # The same path on more cores: only the shared bound moves.
    assert ceiling_rps([50.0, 50.0, 50.0], 50.0, cpus=2) == 10000.0
    assert ceiling_rps([50.0, 50.0, 50.0], 50.0, cpus=4) == 20000.0
    # Idle watched processes (0 us) neither add nor bind; nothing measured is no ceiling.
    assert ceiling_rps([0.0, 25.0], 25.0, cpus=1) == 20000.0
    assert ceiling_rps([0.0], 0.0, cpus=2) is None
    assert ceiling_rps([], 40.0, cpus=2) == 50000.0  # only the driver measured: shared only


def test_a_ratio_bounded_by_its_numerators_ceiling_against_the_measured_denominator() -> None:
    def c(rps: float, ceiling: float | None) -> dict[str, object]:
        return {**m(rps, 50), **({} if ceiling is None else {"ceiling_rps": ceiling})}

    measured = sides(
        {
            "hello": [c(29000, 29000), c(30000, 30000), c(28000, 31000)],
            "issuer": [c(12500, 17000), c(12000, 16000), c(13000, 18000)],
            "old": [c(9000, None)],
        }
    )
    assert measured["issuer"]["ceiling_rps"] == 17000.0 and "ceiling_rps" not in measured["old"]
    got = ratios(
        measured,
        {"issuer/hello": Ratio("issuer", "hello", 0.60), "old/hello": Ratio("old", "hello")},
    )
    # issuer at its ceiling (17,000) against hello as measured (29,000): 0.586 at most.
    assert got["issuer/hello"] == {"value": 0.431, "target": 0.60, "met": False, "ceiling": 0.586}
    assert "ceiling" not in got["old/hello"]
    lines = ratio_lines(got)
    assert lines[0].endswith("(target >= 0.60: NOT met)  [at its box ceiling 0.59]")
    assert lines[1].endswith("0.31")
    table = table_lines(measured, {"issuer": "gateway"})
    assert table[2].split()[-4:] == ["17,000", "0.74", "n/a", "(gateway)"]  # 12,500 of 17,000
    assert table[3].split()[-4:] == ["n/a", "n/a", "n/a", "()"]


def test_the_box_busy_share_is_a_median_and_a_column() -> None:
    busy = [{**m(1000, 50), "box_busy": b} for b in (0.97, 0.62, 0.85)]
    measured = sides({"issuer": busy, "old": [m(900, 50)]})
    assert measured["issuer"]["box_busy"] == 0.85 and "box_busy" not in measured["old"]
    table = table_lines(measured, {"issuer": "issuer"})
    assert table[0].split()[-2:] == ["busy", "(process)"]
    assert table[1].split()[-2:] == ["0.85", "(issuer)"]
    assert table[2].split()[-2:] == ["n/a", "()"]


def test_lines() -> None:
    measured = sides({"hello": [m(24226, 31.6)], "gateway": [m(4398, 143.3)]})
    table = table_lines(measured, {"gateway": "gateway", "hello": "hello"})
    assert table[2].split() == [
        "gateway", "4,398", "1.00", "10.00", "143.3", "n/a", "n/a", "n/a", "(gateway)"
    ]  # fmt: skip
    assert table[1].split()[4] == "n/a"  # hello's process reported no CPU in this sample
    lines = ratio_lines(ratios(measured, {"g/h": Ratio("gateway", "hello", 0.7)}))
    assert lines == ["  g/h                          0.18  (target >= 0.70: NOT met)"]


def test_revisions_interleave_before_and_after_per_path() -> None:
    from flashcoupon_loadtest.bench_revisions import interleaved, revision_ratios

    assert interleaved(["gateway", "soldout"]) == [
        "hello",
        "before:gateway",
        "after:gateway",
        "before:soldout",
        "after:soldout",
    ]
    wanted = revision_ratios(["gateway"])
    assert wanted["gateway after/before"] == Ratio("after:gateway", "before:gateway")
    assert wanted["before: gateway/hello"] == Ratio("before:gateway", "hello")
    assert set(wanted) == {"gateway after/before", "before: gateway/hello", "after: gateway/hello"}


def test_publish_writes_the_report_and_prints_the_table(
    tmp_path: object, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import argparse
    import json
    from pathlib import Path

    from flashcoupon_loadtest import benchkit

    monkeypatch.setattr(benchkit, "RESULTS", Path(str(tmp_path)))
    report = benchkit.publish(
        "demo-paths",
        argparse.Namespace(users=10),
        {"hello": [m(1000, 30)], "gateway": [m(600, 100)]},
        {"gateway/hello": Ratio("gateway", "hello", 0.5)},
        {"hello": "gateway", "gateway": "gateway"},
        heading=["before = x"],
        named={"throughput_ratio": "gateway/hello"},
        before={"sha": "abc"},
    )
    written = json.loads((Path(str(tmp_path)) / "bench-demo-paths.json").read_text())
    assert written == report
    assert written["throughput_ratio"] == 0.6 and written["before"] == {"sha": "abc"}
    assert written["config"] == {"users": 10} and set(written["paths"]) == {"hello", "gateway"}
    out = capsys.readouterr().out
    assert "before = x" in out and "gateway/hello" in out and "(target >= 0.50: met)" in out


def test_the_crowd_path_presses_from_one_address_per_shopper_through_the_gateway() -> None:
    from flashcoupon_loadtest import bench_gateway
    from flashcoupon_loadtest.scenarios import Burst

    crowd = bench_gateway._burst("crowd", "ev", 10, 4, "p-")
    plain = bench_gateway._burst("gateway", "ev", 10, 4, "p-")
    assert isinstance(crowd, Burst) and crowd.mode == plain.mode == "gateway"
    assert crowd.forwarded_for and not plain.forwarded_for
    addresses = {crowd.shopper_headers(None, i, "u")["X-Forwarded-For"] for i in range(300)}
    assert len(addresses) == 300
    assert "crowd" in bench_gateway.PATHS and "crowd/gateway" in bench_gateway.RATIOS
