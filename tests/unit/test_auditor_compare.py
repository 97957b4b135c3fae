from __future__ import annotations

import orjson
import pytest
from flashcoupon_common.messages import CouponIssued, Discount
from flashcoupon_persister.auditor import Comparison, MysqlCoupon, compare
from flashcoupon_persister.auditor_cli import parse_args, render_json, render_text

EV = "bf-2026"


def rec(user: str, seq: int = 1, code: str | None = None, tier: str = "big", at: int = 1000):
    return CouponIssued(
        event_id=EV,
        user_id=user,
        seq=seq,
        code=code or f"C-{user}-{seq}",
        tier=tier,
        discount=Discount("fixed", amount=100),
        issued_at_ms=at,
        expires_at_ms=at + 10,
        request_id=f"r-{user}",
    )


def row(user: str, seq: int = 1, code: str | None = None, tier: str = "big") -> MysqlCoupon:
    return MysqlCoupon(EV, user, seq, code or f"C-{user}-{seq}", tier)


def test_identical_sides_are_clean() -> None:
    users = [f"u{i}" for i in range(50)]
    report = compare([rec(u) for u in users], [row(u) for u in reversed(users)], event_id=EV)
    assert report.clean
    assert (report.redis_count, report.mysql_count) == (50, 50)
    assert not (report.missing or report.extra or report.mismatched)


def test_missing_extra_and_mismatched_are_told_apart() -> None:
    redis = [rec("a"), rec("b"), rec("c"), rec("d", tier="small"), rec("e", seq=2)]
    mysql = [row("a"), row("c", code="OTHER"), row("d"), row("x"), row("e", seq=1)]
    report = compare(redis, mysql, event_id=EV)
    assert not report.clean
    assert [(r.user_id, r.seq) for r in report.missing] == [("b", 1), ("e", 2)]
    assert [(r.user_id, r.seq) for r in report.extra] == [("e", 1), ("x", 1)]
    assert [(m.user_id, m.redis_code, m.mysql_code) for m in report.mismatched] == [
        ("c", "C-c-1", "OTHER"),
        ("d", "C-d-1", "C-d-1"),  # same code, different tier
    ]
    assert report.missing[0] == redis[1]  # the whole record, ready to re-publish


def test_records_after_the_cutoff_are_in_flight_not_missing() -> None:
    report = compare([rec("old", at=500), rec("new", at=2000)], [], event_id=EV, cutoff_ms=1000)
    assert [r.user_id for r in report.missing] == ["old"]
    assert report.in_flight == 1


def test_mysql_side_must_come_first() -> None:
    cmp = Comparison(EV)
    cmp.add_redis(rec("a"))
    with pytest.raises(RuntimeError, match="MySQL row before"):
        cmp.add_mysql(row("a"))


def test_text_and_json_reports_count_and_cap_examples() -> None:
    report = compare([rec(f"m{i}") for i in range(7)], [row("x")], event_id=EV)
    report.republished = 7
    text = render_text([report], examples=2)
    assert "event bf-2026: DRIFT" in text and "missing=7 extra=1 mismatched=0" in text
    assert text.count("  missing ") == 2 and "republished 7" in text
    body = orjson.loads(render_json([report], examples=3))
    assert body["clean"] is False
    ev = body["events"][0]
    assert (ev["missing"], ev["extra"], ev["republished"]) == (7, 1, 7)
    assert len(ev["examples"]["missing"]) == 3
    assert ev["examples"]["extra"] == [{"userId": "x", "seq": 1, "code": "C-x-1", "tier": "big"}]
    clean = compare([rec("a")], [row("a")], event_id=EV)
    assert orjson.loads(render_json([clean], examples=3))["clean"] is True


def test_cli_arguments() -> None:
    args = parse_args(["--event", "a", "--event", "b-2", "--repair", "--json"])
    assert args.event == ["a", "b-2"] and args.repair and args.json and not args.all
    assert parse_args(["--all"]).all
    for bad in (
        [],
        ["--all", "--event", "a"],
        ["--event", "Not_Valid"],
        ["--all", "--examples", "-1"],
    ):
        with pytest.raises(SystemExit) as exit_:
            parse_args(bad)
        assert exit_.value.code == 2
