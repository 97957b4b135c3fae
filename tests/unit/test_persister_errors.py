"""Which database errors the persister retries and which it dead-letters."""

from __future__ import annotations

import pytest
from asyncmy import errors as my
from flashcoupon_persister.errors import ErrorKind, classify, mysql_error_code
from sqlalchemy import exc as sa_exc


def wrap(cls: type[sa_exc.DBAPIError], orig: Exception, invalidated: bool = False) -> Exception:
    return cls("INSERT ...", None, orig, connection_invalidated=invalidated)


@pytest.mark.parametrize(
    ("code", "orig_cls", "wrapper"),
    [
        (2003, my.OperationalError, sa_exc.OperationalError),  # connection refused
        (2006, my.OperationalError, sa_exc.OperationalError),  # server gone away
        (2013, my.OperationalError, sa_exc.OperationalError),  # lost connection
        (1205, my.OperationalError, sa_exc.OperationalError),  # lock wait timeout
        (1213, my.OperationalError, sa_exc.OperationalError),  # deadlock
        (1040, my.OperationalError, sa_exc.OperationalError),  # too many connections
        (1053, my.OperationalError, sa_exc.OperationalError),  # shutdown in progress
    ],
)
def test_transient_codes(code: int, orig_cls: type, wrapper: type) -> None:
    assert classify(wrap(wrapper, orig_cls(code, "x"))) is ErrorKind.TRANSIENT


@pytest.mark.parametrize(
    ("code", "orig_cls", "wrapper"),
    [
        (1062, my.IntegrityError, sa_exc.IntegrityError),  # duplicate not absorbed
        (1452, my.IntegrityError, sa_exc.IntegrityError),  # FK: event row missing
        (1406, my.DataError, sa_exc.DataError),  # data too long
        (1366, my.DataError, sa_exc.DataError),  # incorrect value
        (1048, my.IntegrityError, sa_exc.IntegrityError),  # NOT NULL
        (1292, my.DataError, sa_exc.DataError),  # bad datetime
    ],
)
def test_permanent_codes(code: int, orig_cls: type, wrapper: type) -> None:
    assert classify(wrap(wrapper, orig_cls(code, "x"))) is ErrorKind.PERMANENT


def test_invalidated_connection_is_transient_even_with_a_permanent_looking_code() -> None:
    exc = wrap(sa_exc.IntegrityError, my.IntegrityError(1062, "dup"), invalidated=True)
    assert classify(exc) is ErrorKind.TRANSIENT


def test_unknown_errors_are_retried_not_dead_lettered() -> None:
    # A missing table (migrations not run yet) must stall, not send every record to the DLQ.
    assert classify(wrap(sa_exc.ProgrammingError, my.ProgrammingError(1146, "no table"))) is (
        ErrorKind.TRANSIENT
    )
    assert classify(ConnectionRefusedError(111, "refused")) is ErrorKind.TRANSIENT
    assert classify(TimeoutError()) is ErrorKind.TRANSIENT
    assert classify(RuntimeError("?")) is ErrorKind.TRANSIENT


def test_integrity_error_without_a_known_code_is_permanent() -> None:
    assert classify(wrap(sa_exc.IntegrityError, my.IntegrityError(4999, "?"))) is (
        ErrorKind.PERMANENT
    )


def test_error_code_is_found_through_wrappers_and_causes() -> None:
    orig = my.OperationalError(2013, "lost")
    assert mysql_error_code(wrap(sa_exc.OperationalError, orig)) == 2013
    try:
        try:
            raise orig
        except my.OperationalError as inner:
            raise ValueError("outer") from inner
    except ValueError as outer:
        assert mysql_error_code(outer) == 2013
    assert mysql_error_code(RuntimeError("no code")) is None
