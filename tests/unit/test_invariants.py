"""The invariant checker catches what it must: planted oversell, duplicates, lost rows."""

from __future__ import annotations

from flashcoupon_loadtest.invariants import (
    Holding,
    all_passed,
    check_all,
    check_answers_persisted,
    check_codes_and_tiers,
    check_mysql_matches_redis,
    check_per_user,
    check_supply,
    format_checks,
)

TIERS = {"big": 2, "small": 8}


def clean_drop() -> tuple[list[Holding], list[Holding], list[tuple[str, str]]]:
    """10 coupons (2 big, 8 small) to 10 users, all persisted, all answered 201."""
    redis = [Holding(f"u{i}", 1, f"CODE{i:04d}", "big" if i < 2 else "small") for i in range(10)]
    return redis, list(redis), [(h.user, h.code) for h in redis]


def run(redis: list[Holding], mysql: list[Holding], answers: list[tuple[str, str]], **kw: int):
    args = {"quantity": 10, "per_user_limit": 1, "issued_counter": len(redis), "demand": 100}
    args.update(kw)
    return check_all(tier_quantities=TIERS, redis=redis, mysql=mysql, answers=answers, **args)


def verdicts(checks) -> dict[int, str]:
    return {c.number: c.verdict for c in checks}


def test_clean_drop_passes_every_invariant() -> None:
    checks = run(*clean_drop())
    assert verdicts(checks) == {1: "PASS", 2: "PASS", 3: "PASS", 4: "PASS", 5: "PASS"}
    assert all_passed(checks)
    assert "[PASS] 1." in format_checks(checks)


def test_planted_oversell_fails_supply_and_tiers() -> None:
    redis, mysql, answers = clean_drop()
    extra = Holding("u99", 1, "CODE0099", "small")
    redis.append(extra)
    mysql.append(extra)
    answers.append((extra.user, extra.code))
    checks = run(redis, mysql, answers)
    v = verdicts(checks)
    assert v[1] == "FAIL" and v[3] == "FAIL"
    assert "oversold" in checks[0].detail
    assert not all_passed(checks)
    assert "[FAIL] 1." in format_checks(checks)


def test_oversell_seen_by_the_counter_alone_fails() -> None:
    redis, _mysql, _answers = clean_drop()
    assert not check_supply(11, len(redis), 10, 100).passed


def test_undersold_when_demand_exceeds_supply_fails() -> None:
    redis, mysql, answers = clean_drop()
    del redis[-1], mysql[-1], answers[-1]
    assert not check_supply(9, 9, 10, demand=100).passed
    assert check_supply(9, 9, 10, demand=9).passed  # fewer shoppers than coupons: fine


def test_planted_duplicate_user_fails_per_user_limit() -> None:
    redis, mysql, _answers = clean_drop()
    redis[9] = Holding("u0", 2, "CODE0009", "small")  # u0 got a second coupon
    mysql[9] = redis[9]
    check = check_per_user(redis, mysql, 1)
    assert not check.passed
    assert any("u0 holds 2" in e for e in check.examples)
    assert check_per_user(redis, mysql, 2).passed  # allowed with perUserLimit 2


def test_planted_duplicate_code_fails_uniqueness() -> None:
    redis, mysql, _answers = clean_drop()
    redis[9] = Holding("u9", 1, "CODE0008", "small")  # same code for two users
    check = check_codes_and_tiers(redis, mysql, TIERS)
    assert not check.passed
    assert any("CODE0008 issued twice" in e for e in check.examples)


def test_same_code_answered_to_two_shoppers_fails() -> None:
    redis, mysql, answers = clean_drop()
    answers.append(("u5", "CODE0001"))
    assert not check_codes_and_tiers(redis, mysql, TIERS, answers).passed


def test_tier_totals_must_be_exact_once_sold_out() -> None:
    redis, mysql, _answers = clean_drop()
    redis[2] = redis[2]._replace(tier="big")  # 3 big, 7 small: shares broken
    assert not check_codes_and_tiers(redis, mysql, TIERS).passed
    partial = [h for h in clean_drop()[0] if h.tier == "small"]  # not sold out: within caps
    assert check_codes_and_tiers(partial, partial, TIERS).passed


def test_planted_missing_mysql_row_fails_one_for_one_and_persisted() -> None:
    redis, mysql, answers = clean_drop()
    lost = mysql.pop(4)
    checks = run(redis, mysql, answers)
    v = verdicts(checks)
    assert v[4] == "FAIL" and v[5] == "FAIL"
    assert v[1] == v[2] == v[3] == "PASS"
    assert any(lost.code in e for e in checks[3].examples)
    assert any(f"{lost.user} was told {lost.code}" in e for e in checks[4].examples)


def test_extra_or_mismatched_mysql_row_fails_one_for_one() -> None:
    redis, mysql, _answers = clean_drop()
    assert not check_mysql_matches_redis(redis, [*mysql, Holding("x", 1, "ZZZ", "small")]).passed
    mysql[3] = mysql[3]._replace(user="someone-else")
    check = check_mysql_matches_redis(redis, mysql)
    assert not check.passed
    assert "mismatched 1" in check.detail


def test_answer_persisted_under_another_user_fails() -> None:
    _redis, mysql, answers = clean_drop()
    assert not check_answers_persisted([("intruder", "CODE0003")], mysql).passed
    assert check_answers_persisted(answers, mysql).passed
