"""Batch writes of issued coupons into `user_coupons`, exactly once per coupon.

One transaction per batch: a multi-row `INSERT … ON DUPLICATE KEY UPDATE id=id` (the rows and
the verdict on absorbed ones are in rows.py). The UNIQUE constraints (event, user, seq) and
(code) make a redelivered record a no-op, while other errors (FK, truncation, NULL) still fail
loudly — which `INSERT IGNORE` would hide.

The subtle part is telling a true duplicate from a conflict, since the upsert absorbs both.
The engine is set up without CLIENT_FOUND_ROWS, so the statement's rowcount is the number of
rows actually inserted; when it equals the batch size nothing was absorbed and we are done.
Otherwise one indexed SELECT by code, inside the same transaction, decides per row (`judge`).

Every wait for the database is bounded (`timeout_s`, one answer at a time): a server that
accepts the connection but never answers would otherwise hold the batch forever. The deadline
cancels the pending read; asyncmy then closes the socket and SQLAlchemy treats the cancellation
as a disconnect and terminates the connection instead of returning it to the pool, so a
half-finished transaction is never reused. The batch is retried; if the server committed just
before the deadline, the retry's rows are absorbed as duplicates.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from asyncmy.constants import CLIENT
from flashcoupon_common.messages import CouponIssued
from sqlalchemy import bindparam, event, text
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from .errors import ErrorKind, classify, mysql_error_code
from .rows import INSERT_SQL, Rejected, Slot, judge, to_row

logger = logging.getLogger(__name__)

_SELECT_BY_CODE = text(
    "SELECT code, event_id, user_id, seq FROM user_coupons WHERE code IN :codes"
).bindparams(bindparam("codes", expanding=True))


class TransientWriteError(Exception):
    """The batch could not be written now; retry it later as a whole."""


class WriteTimeout(TransientWriteError):
    """The database did not answer within the timeout; the connection was discarded."""


@dataclass(slots=True)
class WriteResult:
    inserted: int = 0
    duplicates: int = 0
    rejected: list[Rejected] = field(default_factory=list)


def _clear_found_rows(dialect: Any, conn_rec: Any, cargs: Any, cparams: dict[str, Any]) -> None:
    # SQLAlchemy's MySQL dialects force CLIENT_FOUND_ROWS; we need "affected rows" so that an
    # absorbed duplicate counts 0 and the rowcount tells whether any row was absorbed.
    cparams["client_flag"] = cparams.get("client_flag", 0) & ~CLIENT.FOUND_ROWS


def _session_setup(dbapi_conn: Any, conn_rec: Any) -> None:
    # Strict mode makes truncation an error (1406) instead of a warning, whatever the server's
    # default; UTC so server-side NOW(3) defaults agree with the UTC timestamps we write.
    cursor = dbapi_conn.cursor()
    cursor.execute("SET SESSION sql_mode='STRICT_ALL_TABLES,NO_ENGINE_SUBSTITUTION'")
    cursor.execute("SET SESSION time_zone='+00:00'")
    cursor.close()


def prepare_engine(engine: AsyncEngine) -> AsyncEngine:
    """Install the connection setup the writer relies on; call before the first connect."""
    sync = engine.sync_engine
    if not event.contains(sync, "do_connect", _clear_found_rows):
        event.listen(sync, "do_connect", _clear_found_rows)
        event.listen(sync, "connect", _session_setup)
    return engine


Answered = Callable[[], None]  # "the database just answered": restarts the deadline


class BatchWriter:
    def __init__(self, engine: AsyncEngine, *, timeout_s: float = 5.0) -> None:
        self.engine = prepare_engine(engine)
        self.timeout_s = timeout_s

    @contextlib.asynccontextmanager
    async def _deadline(self) -> AsyncIterator[Answered]:
        """Allow `timeout_s` until the next answer; raise WriteTimeout when it passes."""
        loop = asyncio.get_running_loop()
        timeout = asyncio.timeout(self.timeout_s)
        try:
            async with timeout:
                yield lambda: timeout.reschedule(loop.time() + self.timeout_s)
        except TimeoutError as exc:
            if not timeout.expired():
                raise  # not ours: handled like any other timeout
            raise WriteTimeout(
                f"the database did not answer within {self.timeout_s:g}s; connection discarded"
            ) from exc

    async def write(self, coupons: Sequence[CouponIssued]) -> WriteResult:
        """Store a batch; raises TransientWriteError when it should be retried as a whole."""
        result = WriteResult()
        rows: list[tuple[int, CouponIssued, tuple[Any, ...]]] = []
        for i, c in enumerate(coupons):
            try:
                rows.append((i, c, to_row(c)))
            except (OverflowError, ValueError) as exc:
                result.rejected.append(Rejected(i, "invalid", "INVALID_VALUE", str(exc)))
        if not rows:
            return result
        try:
            async with self._deadline() as answered:
                await self._write_batch(rows, result, answered)
        except DBAPIError as exc:
            if classify(exc) is ErrorKind.TRANSIENT:
                raise TransientWriteError(str(exc.orig)) from exc
            logger.warning(
                "batch of %d failed permanently (mysql %s); isolating row by row",
                len(rows),
                mysql_error_code(exc),
            )
            await self._write_rows(rows, result)
        except (SQLAlchemyError, OSError, TimeoutError) as exc:
            # Pool timeouts, disconnects seen outside a statement, sockets: all worth a retry.
            raise TransientWriteError(repr(exc)) from exc
        return result

    async def _write_batch(
        self,
        rows: list[tuple[int, CouponIssued, tuple[Any, ...]]],
        result: WriteResult,
        answered: Answered,
    ) -> None:
        async with self.engine.begin() as conn:
            res = await conn.exec_driver_sql(INSERT_SQL, [r for _, _, r in rows])
            answered()
            inserted = res.rowcount
            if inserted == len(rows):
                result.inserted += inserted
                return
            await self._judge(conn, [(i, c) for i, c, _ in rows], inserted, result, answered)

    async def _write_rows(
        self, rows: list[tuple[int, CouponIssued, tuple[Any, ...]]], result: WriteResult
    ) -> None:
        """Slow path: one savepoint per row, so poison rows fail alone and the rest commit."""
        try:
            async with self._deadline() as answered, self.engine.begin() as conn:
                survivors: list[tuple[int, CouponIssued]] = []
                inserted = 0
                for i, c, row in rows:
                    try:
                        async with conn.begin_nested():
                            res = await conn.exec_driver_sql(INSERT_SQL, row)
                    except DBAPIError as exc:
                        if classify(exc) is ErrorKind.TRANSIENT:
                            raise
                        answered()
                        code = mysql_error_code(exc)
                        result.rejected.append(
                            Rejected(i, "constraint", f"MYSQL_{code}", str(exc.orig))
                        )
                        continue
                    answered()
                    inserted += res.rowcount
                    survivors.append((i, c))
                if survivors:
                    await self._judge(conn, survivors, inserted, result, answered)
        except (SQLAlchemyError, OSError, TimeoutError) as exc:
            raise TransientWriteError(repr(exc)) from exc

    async def _judge(
        self,
        conn: AsyncConnection,
        coupons: list[tuple[int, CouponIssued]],
        inserted: int,
        result: WriteResult,
        answered: Answered,
    ) -> None:
        codes = list({c.code for _, c in coupons})
        found = await conn.execute(_SELECT_BY_CODE, {"codes": codes})
        answered()
        by_code = {r.code: (r.event_id, r.user_id, r.seq) for r in found}
        by_slot: dict[Slot, str] = {}
        missing = [c for _, c in coupons if c.code not in by_code]
        if missing:
            # Rare path (a conflict): fetch the codes holding those slots, for the DLQ detail.
            for c in missing:
                row = (
                    await conn.execute(
                        text(
                            "SELECT code FROM user_coupons "
                            "WHERE event_id=:e AND user_id=:u AND seq=:s"
                        ),
                        {"e": c.event_id, "u": c.user_id, "s": c.seq},
                    )
                ).first()
                answered()
                if row is not None:
                    by_slot[(c.event_id, c.user_id, c.seq)] = row.code
        stored, rejected = judge(coupons, by_code, by_slot)
        result.inserted += inserted
        result.duplicates += stored - inserted
        result.rejected.extend(rejected)
