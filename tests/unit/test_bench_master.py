"""bench_master's variants of issue.lua and its arithmetic (the runs themselves need Redis:
tests/integration/test_bench_master.py)."""

from __future__ import annotations

import subprocess

import pytest
from flashcoupon_common.lua import ISSUE
from flashcoupon_loadtest.bench_master import (
    ISSUE_LUA,
    VARIANTS,
    Cost,
    Variant,
    press_calls,
    revision_variant,
    summary,
)
from flashcoupon_loadtest.localrun import ROOT


def test_every_cut_matches_the_deployed_script_once() -> None:
    for variant in VARIANTS:
        source = variant.source(ISSUE.source)
        if variant.cuts:
            assert source != ISSUE.source, variant.name
            for old, new in variant.cuts:
                assert old not in source and new in source, variant.name
        else:
            assert source == ISSUE.source, variant.name


def test_a_cut_that_does_not_match_names_its_variant() -> None:
    gone = Variant("gone", (("redis.call('NO_SUCH_COMMAND')", "x"),))
    with pytest.raises(ValueError, match=r"variant gone: .* occurs 0 times"):
        gone.source(ISSUE.source)
    twice = Variant("twice", (("redis.call(", "x"),))
    with pytest.raises(ValueError, match=r"variant twice: .* not once"):
        twice.source(ISSUE.source)


def test_press_calls_hold_every_press_once_in_issue_luas_stride() -> None:
    calls = press_calls(70, 32, "t")
    assert [len(argv) // ISSUE.stride for argv in calls] == [32, 32, 6]
    assert all(len(argv) % ISSUE.stride == 0 for argv in calls)
    users = [argv[i] for argv in calls for i in range(0, len(argv), ISSUE.stride)]
    assert users == [f"t-u{i}" for i in range(70)]
    assert calls[0][: ISSUE.stride] == ["t-u0", "t-r0", "", "", ""]


def test_the_allowance_variant_presses_carry_the_default_per_shopper_limit() -> None:
    calls = press_calls(3, 2, "t", allowance=True)
    stride = ISSUE.stride
    presses = [argv[i : i + stride] for argv in calls for i in range(0, len(argv), stride)]
    assert [p[0] for p in presses] == ["t-u0", "t-u1", "t-u2"]
    # AdmissionSpec's defaults: 2 per second (an interval of 500,000 us), a burst of 5.
    assert all(p[3:] == ["500000", "5"] for p in presses)
    assert [v.name for v in VARIANTS if v.allowance] == ["allowance"]


def test_summary_takes_medians_against_as_is() -> None:
    s = summary(
        {
            "as-is": [Cost(20.0, 6.0), Cost(22.0, 5.0), Cost(21.0, 9.0)],
            "no-outbox": [Cost(16.0, 3.0), Cost(17.0, 2.0), Cost(30.0, 2.5)],
        }
    )
    assert s["as-is"] == {
        "cpu_us_per_issue": 21.0,
        "repeats": [20.0, 22.0, 21.0],
        "ratio_vs_as_is": 1.0,
        "saves_us": 0.0,
        "replica_cpu_us_per_issue": 6.0,
        "replica_repeats": [6.0, 5.0, 9.0],
    }
    assert s["no-outbox"]["replica_cpu_us_per_issue"] == 2.5
    assert s["no-outbox"]["cpu_us_per_issue"] == 17.0
    assert s["no-outbox"]["ratio_vs_as_is"] == pytest.approx(17 / 21, abs=1e-3)
    assert s["no-outbox"]["saves_us"] == 4.0


def test_a_revision_variant_runs_issue_lua_as_committed_there() -> None:
    committed = subprocess.run(
        ["git", "show", f"HEAD:{ISSUE_LUA}"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    variant = revision_variant("HEAD")
    assert variant.name == "at HEAD"
    assert variant.source(ISSUE.source) == committed
    assert (ROOT / ISSUE_LUA).read_text() == ISSUE.source  # the path names the deployed script


def test_an_unknown_revision_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="--against no-such-rev"):
        revision_variant("no-such-rev")
