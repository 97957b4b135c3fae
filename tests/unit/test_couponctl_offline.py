"""couponctl commands that need no server: validate, the --name/--start-in overrides, progress."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from flashcoupon_operator.cli import EXIT_INVALID, EXIT_OK, _ProgressPrinter, main, overrides
from flashcoupon_operator.manifest import ManifestError, parse_manifests

ROOT = Path(__file__).resolve().parents[2]
BLACK_FRIDAY = ROOT / "k8s/examples/black-friday.yaml"


def test_validate_prints_a_summary(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "-f", str(BLACK_FRIDAY)]) == EXIT_OK
    out = capsys.readouterr().out
    assert out == (
        "couponevent/black-friday valid: 10,000 coupons (big 1,000, small 9,000), "
        "2026-11-27T14:00:00+09:00 .. 2026-11-27T23:59:59+09:00\n"
    )


def test_validate_lists_every_error_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = BLACK_FRIDAY.read_text().replace("quantity: 10000", "quantity: -1")
    bad = bad.replace("share: 90", "share: 0")
    path = tmp_path / "bad.yaml"
    path.write_text(bad)
    assert main(["validate", "-f", str(path)]) == EXIT_INVALID
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"{path}: 2 error(s):",
        "  spec.quantity: must be an integer 1..10,000,000, got -1",
        "  spec.tiers[1].share: must be an integer 1..100, got 0",
    ]


def test_unreadable_file_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "-f", "/nonexistent/x.yaml"]) == EXIT_INVALID
    assert "cannot read /nonexistent/x.yaml" in capsys.readouterr().err


def test_overrides_rename_and_move_the_window_keeping_its_length() -> None:
    specs = parse_manifests(BLACK_FRIDAY.read_text())
    now = datetime(2026, 11, 23, 11, 0, 0, 500_000, tzinfo=UTC)
    (moved,) = overrides(specs, name="bf-demo-1", start_in="10s", now=now)
    assert moved.event_id == "bf-demo-1"
    assert moved.start_at == datetime(2026, 11, 23, 11, 0, 10, tzinfo=UTC)
    assert moved.end_at - moved.start_at == specs[0].end_at - specs[0].start_at
    assert moved.tiers == specs[0].tiers


@pytest.mark.parametrize(
    ("name", "start_in", "path"),
    [("Bad", None, "--name"), (None, "soon", "--start-in"), (None, "10d", "--start-in")],
)
def test_bad_overrides_name_the_option(name: str | None, start_in: str | None, path: str) -> None:
    specs = parse_manifests(BLACK_FRIDAY.read_text())
    with pytest.raises(ManifestError) as info:
        overrides(specs, name=name, start_in=start_in, now=datetime.now(UTC))
    assert info.value.errors[0].path == path


def test_name_override_needs_a_single_event() -> None:
    text = BLACK_FRIDAY.read_text()
    specs = parse_manifests(text + "---\n" + text.replace("name: black-friday", "name: other"))
    with pytest.raises(ManifestError):
        overrides(specs, name="x", start_in=None, now=datetime.now(UTC))
    both = overrides(specs, name=None, start_in="0s", now=datetime.now(UTC))
    assert both[0].start_at == both[1].start_at
    assert both[0].end_at - both[0].start_at == timedelta(hours=9, minutes=59, seconds=59)


def test_progress_prints_each_ten_percent_once(capsys: pytest.CaptureFixture[str]) -> None:
    printer = _ProgressPrinter("ev")
    for done in (0, 50, 99, 100, 101, 250, 999, 1000):
        printer(done, 1000)
    assert capsys.readouterr().out.splitlines() == [
        "preloading ev: 0% (0/1,000)",
        "preloading ev: 10% (100/1,000)",
        "preloading ev: 25% (250/1,000)",
        "preloading ev: 99% (999/1,000)",
        "preloading ev: 100% (1,000/1,000)",
    ]
