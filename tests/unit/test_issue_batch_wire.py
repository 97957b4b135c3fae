"""The gateway → issuer batch format (flashcoupon_common.issue_batch): both ends agree."""

from __future__ import annotations

import pytest
from flashcoupon_common.issue_batch import (
    MAX_PRESSES,
    BatchError,
    Press,
    decode_answers,
    decode_presses,
    encode_answers,
    encode_presses,
)


def test_presses_round_trip_with_unicode_users_and_missing_keys() -> None:
    presses = [Press("ev-1", "zoë 😀", "k-1", None), Press("ev-1", "bob", None, "00-ab")]
    assert decode_presses(encode_presses(presses)) == presses


def test_answers_round_trip_any_bytes_without_content_length() -> None:
    body = '{"detail":"zoë"}'.encode() + bytes(range(256))
    answers = [
        (201, [(b"content-type", b"application/json"), (b"content-length", b"9")], body),
        (410, [(b"content-type", b"application/problem+json")], b"{}"),
    ]
    decoded = decode_answers(encode_answers(answers), 2)
    assert decoded == [
        (201, [(b"content-type", b"application/json")], body),
        (410, [(b"content-type", b"application/problem+json")], b"{}"),
    ]


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"{}",
        b"[]",
        b'[["e", "u", "k"]]',
        b'[["e", "u", 1, null]]',
        b'[[null, "u", null, null]]',
        b"[" + b'["e","u",null,null],' * MAX_PRESSES + b'["e","u",null,null]]',
    ],
)
def test_presses_that_are_not_a_batch_are_refused(raw: bytes) -> None:
    with pytest.raises(BatchError):
        decode_presses(raw)


@pytest.mark.parametrize("raw", [b"nope", b"[]", b'[[201, [], "x"]]', b'[[201, 5, "x"], [1]]'])
def test_answers_that_do_not_match_the_presses_are_refused(raw: bytes) -> None:
    with pytest.raises(BatchError):
        decode_answers(raw, 2)


def test_a_press_carries_its_allowance_only_when_asked() -> None:
    """Four elements without an allowance (what an issuer that predates it reads), five with."""
    from flashcoupon_common.issue_batch import allowance_limit, format_allowance, parse_allowance

    plain, limited = Press("ev", "ann", None, None), Press("ev", "bob", "k", None, (500_000, 5))
    raw = encode_presses([plain, limited])
    assert raw == b'[["ev","ann",null,null],["ev","bob","k",null,[500000,5]]]'
    assert decode_presses(raw) == [plain, limited]
    assert decode_presses(b'[["ev","ann",null,null,null]]') == [plain]
    assert allowance_limit("500000 5") == (500_000, 5) == allowance_limit([500_000, 5])
    for bad in ("", "1", "0 5", "5 0", "-1 5", "a b", "1 2 3", [True, 5], [1.5, 5], [1, "x"]):
        assert allowance_limit(bad) is None, bad
    assert parse_allowance(format_allowance(4, 2_500_000, 0)) == (4, 2_500_000, 0)
    assert parse_allowance("4 2") is None and parse_allowance("-1 2 3") is None


@pytest.mark.parametrize("allowance", [b"[0, 5]", b"[5]", b'"5 5"', b"[true, 5]", b"5"])
def test_a_press_whose_allowance_is_not_two_positive_integers_is_refused(
    allowance: bytes,
) -> None:
    with pytest.raises(BatchError, match="allowance"):
        decode_presses(b'[["ev","ann",null,null,' + allowance + b"]]")


def test_a_refusal_of_allowances_is_told_from_other_batch_refusals() -> None:
    """The gateway resends a batch's presses only when the issuer refused the allowance they
    carried (400 MALFORMED_BATCH to a batch with one): never for another refusal, never for a
    batch that carried none."""
    import orjson
    from flashcoupon_common.issue_batch import Press
    from flashcoupon_gateway.issue_batch import refuses_allowances
    from flashcoupon_gateway.upstream import Answer

    def answer(status: int, code: str) -> Answer:
        return Answer(status, orjson.dumps({"code": code, "status": status}), [])

    with_one = [Press("ev", "a", None, None, (1_000_000, 2)), Press("ev", "b", None, None)]
    without = [Press("ev", "b", None, None)]
    assert refuses_allowances(answer(400, "MALFORMED_BATCH"), with_one)
    assert not refuses_allowances(answer(400, "MALFORMED_BATCH"), without)
    assert not refuses_allowances(answer(400, "PAYLOAD_TOO_LARGE"), with_one)
    assert not refuses_allowances(answer(413, "MALFORMED_BATCH"), with_one)
    assert not refuses_allowances(answer(200, "MALFORMED_BATCH"), with_one)
    assert not refuses_allowances(Answer(400, b"not json", []), with_one)
    assert not refuses_allowances(Answer(400, b"[1]", []), with_one)
