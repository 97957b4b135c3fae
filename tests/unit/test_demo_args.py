"""make demo's options: how many gateway and issuer processes the local run starts."""

from __future__ import annotations

import pytest
from flashcoupon_loadtest.demo import parse_args


def test_two_gateways_and_two_issuers_unless_told() -> None:
    args = parse_args([])
    assert (args.gateways, args.issuers) == (2, 2)
    args = parse_args(["--gateways", "1", "--issuers", "1"])
    assert (args.gateways, args.issuers) == (1, 1)


@pytest.mark.parametrize("bad", [["--issuers", "0"], ["--gateways", "0"], ["--issuers", "-1"]])
def test_no_process_at_all_is_refused(bad: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_args(bad)
    assert exited.value.code == 2
    assert "--gateways and --issuers must each be at least 1" in capsys.readouterr().err
