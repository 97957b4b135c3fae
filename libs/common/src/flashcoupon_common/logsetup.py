"""JSON logs to stdout, configured once per process, with the active trace id when there is one.

The subtle part is `RepeatFilter`: while Kafka is unreachable, aiokafka logs the same
connection error several times a second per client (~870 lines from one persister in a 30 s
outage), which buries everything else. Repeats are folded into one line when a run starts and
one summary line per interval while it lasts, each saying how many lines it stands for.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from opentelemetry import trace


class JSONFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        ctx = trace.get_current_span().get_span_context()
        if ctx.is_valid:
            out["trace_id"] = format(ctx.trace_id, "032x")
            out["span_id"] = format(ctx.span_id, "016x")
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out).decode()


@dataclass(slots=True)
class _Run:
    last: float  # when the latest repeat arrived
    window_start: float  # start of the interval the next summary covers
    suppressed: int = 0  # repeats dropped since window_start


class RepeatFilter(logging.Filter):
    """Folds repeats of one warning/error of the libraries under `prefixes`.

    Records repeat when they share logger, level and message template (`record.msg`, before
    its arguments: node ids and errno vary). The first record of a run passes (a state change:
    something started failing); later ones are counted, and one passes every `every_seconds`
    with "[N similar lines in the last S s]". A run ends after `every_seconds` of silence; the
    next repeat starts a new run. A different message always passes at once.
    """

    def __init__(
        self,
        prefixes: tuple[str, ...] = ("aiokafka", "kafka"),
        every_seconds: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.prefixes = prefixes
        self.every_seconds = every_seconds
        self.clock = clock
        self._runs: dict[tuple[str, int, str], _Run] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or not record.name.startswith(self.prefixes):
            return True
        key = (record.name, record.levelno, str(record.msg))
        now = self.clock()
        run = self._runs.get(key)
        if run is None or now - run.last > self.every_seconds:
            left = run.suppressed if run is not None else 0
            if len(self._runs) >= 1000:  # bounded: forget runs that ended
                self._runs = {
                    k: r for k, r in self._runs.items() if now - r.last <= self.every_seconds
                }
            self._runs[key] = _Run(last=now, window_start=now)
            if left:
                _annotate(record, f"[the previous run ended with {left} more similar lines]")
            return True
        run.last = now
        run.suppressed += 1
        if now - run.window_start < self.every_seconds:
            return False
        _annotate(
            record,
            f"[{run.suppressed} similar lines in the last {now - run.window_start:.0f} s]",
        )
        run.window_start, run.suppressed = now, 0
        return True


def _annotate(record: logging.LogRecord, note: str) -> None:
    # Folded into the message itself, arguments applied first: the note may not be %-safe.
    record.msg, record.args = f"{record.getMessage()} {note}", None


def configure_logging(service: str, level: str | None = None) -> None:
    """JSON lines on stdout at `level`, else FLASHCOUPON_LOG_LEVEL, else INFO."""
    level = level or os.environ.get("FLASHCOUPON_LOG_LEVEL") or "INFO"
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(JSONFormatter(service))
    handler.addFilter(RepeatFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # aiokafka and asyncmy are chatty at INFO; their warnings still come through.
    for noisy in ("aiokafka", "asyncmy", "kafka"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
