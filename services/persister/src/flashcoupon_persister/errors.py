"""Which database errors are worth retrying and which never succeed.

The persister must never dead-letter a record that a retry could have stored (that would lose
an acknowledged coupon), and must not retry forever a record that can never be stored (that
would stall its partition). So the rule is: known constraint/data errors are permanent; known
connectivity/contention errors are transient; anything unknown is treated as transient, which
stalls loudly (retries metric, logs) instead of losing data quietly.
"""

from __future__ import annotations

import enum

from sqlalchemy import exc as sa_exc


class ErrorKind(enum.Enum):
    TRANSIENT = "transient"
    PERMANENT = "permanent"


# MySQL/MariaDB server and client error numbers.
TRANSIENT_CODES = frozenset(
    {
        1040,  # too many connections
        1053,  # server shutdown in progress
        1205,  # lock wait timeout
        1213,  # deadlock found; the transaction was rolled back
        1927,  # MariaDB: connection was killed
        2002,  # can't connect through socket
        2003,  # can't connect to server (refused)
        2006,  # server has gone away
        2013,  # lost connection during query
        2055,  # lost connection at handshake / system error
        4031,  # disconnected by the server for inactivity
    }
)
PERMANENT_CODES = frozenset(
    {
        1048,  # column cannot be null
        1062,  # duplicate entry that the upsert did not absorb
        1264,  # out of range value
        1265,  # data truncated
        1292,  # incorrect datetime value
        1364,  # field has no default
        1366,  # incorrect string/integer value
        1406,  # data too long
        1451,  # FK: row is referenced
        1452,  # FK: parent row missing (event not in coupon_events)
        4025,  # CHECK constraint failed
    }
)


def mysql_error_code(exc: BaseException) -> int | None:
    """The server/client error number behind `exc`, looking through SQLAlchemy's wrapper."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        orig = getattr(cur, "orig", None)
        if isinstance(orig, BaseException) and orig is not cur:
            cur = orig
            continue
        args = getattr(cur, "args", ())
        if args and isinstance(args[0], int) and not isinstance(args[0], bool):
            return args[0]
        cur = cur.__cause__ or cur.__context__
    return None


def classify(exc: BaseException) -> ErrorKind:
    """Transient (retry the whole batch later) or permanent (isolate and dead-letter)."""
    if isinstance(exc, sa_exc.DBAPIError) and exc.connection_invalidated:
        return ErrorKind.TRANSIENT
    code = mysql_error_code(exc)
    if code in PERMANENT_CODES:
        return ErrorKind.PERMANENT
    if code in TRANSIENT_CODES:
        return ErrorKind.TRANSIENT
    if isinstance(exc, (sa_exc.IntegrityError, sa_exc.DataError)):
        return ErrorKind.PERMANENT
    # Connection refused/reset before any handshake (OSError), the pool running dry, a stuck
    # server (timeouts), and everything unknown (say a table missing before migrations ran)
    # are retried: stalling is visible and recoverable, dead-lettering would lose the row.
    return ErrorKind.TRANSIENT
