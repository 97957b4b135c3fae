"""Forwarding to the issuer (by user, over replicas) and the wallet, with load shedding.

Every call goes over a pooled keep-alive connection (pool.HTTPPool), has a timeout, and passes
its upstream's circuit breaker. Timeouts, connection errors and 500/502/504 count as failures;
4xx answers (SOLD_OUT, DUPLICATE, ...) are the upstream working correctly, and a 503 (the
issuer's store failing over) counts neither way (breaker.verdict). With every issuer's breaker
open, the answer is 503 + Retry-After at once.

Each call carries X-Flashcoupon-Deadline-Ms, the time this gateway will wait for the answer, so
the issuer can answer (503, "retry") before the gateway gives up on it.

Every error the shopper sees is problem+json: an upstream error answer that is not JSON (a
server's plain-text 400 or 500, written before our application ran) is replaced by a 502
BAD_UPSTREAM problem rather than relayed, and a request the pool refuses to write (control
characters in the path or a header) is a 400 INVALID_CHARACTERS without any upstream call.
"""

from __future__ import annotations

import itertools
import logging
import time
import zlib
from collections.abc import Mapping
from typing import NamedTuple

from flashcoupon_common.http import Headers, ProblemError
from flashcoupon_common.http1 import ProtocolError, UnsafeRequestError
from flashcoupon_common.issue_batch import ALLOWANCE_HEADER, parse_allowance

from flashcoupon_gateway.breaker import Breaker, State, Verdict, retry_after_header, verdict
from flashcoupon_gateway.metrics import BREAKER_STATE, SHED, UPSTREAM_DURATION
from flashcoupon_gateway.pool import HTTPPool, Sent
from flashcoupon_gateway.settings import GatewaySettings

logger = logging.getLogger(__name__)

DEADLINE_HEADER = "X-Flashcoupon-Deadline-Ms"
# Response headers worth passing back to the shopper.
_PASS_HEADERS = {
    b"content-type",
    b"retry-after",
    b"location",
    b"idempotency-key",
    b"idempotent-replayed",  # the issuer's and the wallet's answer to a replayed request
}
_JSON_TYPES = (b"application/json", b"application/problem+json")
_ALLOWANCE = ALLOWANCE_HEADER.lower().encode()


class Answer(NamedTuple):  # one per forwarded press: cheaper to make than a frozen dataclass
    status: int
    body: bytes
    # The headers worth passing to the shopper, as the upstream sent them (names lower-case):
    # relayed as they are, never decoded and encoded again.
    headers: Headers
    # What the issuer's allowance said (left, reset µs, retry-after µs), when it decided one:
    # read here, never relayed (flashcoupon_common.issue_batch).
    allowance: tuple[int, int, int] | None = None

    def header(self, name: bytes) -> str | None:
        """The passed header `name` (lower case), or None."""
        for k, v in self.headers:
            if k == name:
                return v.decode("latin-1")
        return None


def answer_of(
    up: Upstream,
    method: str,
    path: str,
    status: int,
    raw_headers: list[tuple[bytes, bytes]],
    content: bytes,
) -> Answer:
    """An upstream's answer as relayed to the shopper: the headers worth passing, and a 502
    BAD_UPSTREAM problem in place of an error answer that is not our application's JSON."""
    passed: Headers = []
    allowance = None
    content_type = b""
    for k, v in raw_headers:
        if k in _PASS_HEADERS:
            passed.append((k, v))
            if k == b"content-type":
                content_type = v
        elif k == _ALLOWANCE:
            allowance = parse_allowance(v.decode("latin-1"))
    if status >= 400 and not content_type.startswith(_JSON_TYPES):
        # Not one of our application's answers: the upstream's HTTP server refused the
        # request itself (plain text). Relaying it would break the problem+json contract.
        logger.warning(
            "%s %s answered %d %r to %s %s",
            up.kind, up.base_url, status, content[:100], method, path,
        )  # fmt: skip
        raise ProblemError(502, "BAD_UPSTREAM", f"the {up.kind} could not process the request")
    return Answer(status, content, passed, allowance)


def invalid_characters(exc: UnsafeRequestError) -> ProblemError:
    return ProblemError(400, "INVALID_CHARACTERS", str(exc))


def unavailable(detail: str, retry_after: float, reason: str) -> ProblemError:
    SHED.labels(reason).inc()
    return ProblemError(
        503,
        "SERVICE_UNAVAILABLE",
        detail,
        headers={"Retry-After": retry_after_header(retry_after)},
    )


class Upstream:
    """One upstream base URL, its connection pool and its breaker."""

    def __init__(self, kind: str, base_url: str, breaker: Breaker, connections: int) -> None:
        self.kind = kind
        self.base_url = base_url
        self.breaker = breaker
        self.pool = HTTPPool(base_url, max_connections=connections)
        self._latency = {c: UPSTREAM_DURATION.labels(kind, f"{c}xx") for c in range(1, 6)}
        self.publish_state()

    def observe(self, status: int, seconds: float) -> None:
        child = self._latency.get(status // 100)
        if child is not None:
            child.observe(seconds)

    def publish_state(self) -> None:
        BREAKER_STATE.labels(self.base_url).set(int(self.breaker.state))


def issuer_index(user: str, issuers: int) -> int:
    """Which issuer a user is routed to: crc32, not hash(), so every gateway process agrees."""
    return zlib.crc32(user.encode()) % issuers


class Forwarder:
    def __init__(
        self,
        issuer_urls: tuple[str, ...],
        wallet_url: str,
        *,
        connections: int,
        timeout_seconds: float,
        failure_threshold: int,
        open_seconds: float,
    ) -> None:
        def make(kind: str, url: str) -> Upstream:
            return Upstream(kind, url, Breaker(failure_threshold, open_seconds), connections)

        self.issuers = [make("issuer", u) for u in issuer_urls]
        self.wallet = make("wallet", wallet_url)
        self.timeout = timeout_seconds
        self._deadline_ms = str(int(timeout_seconds * 1000))
        # round-robin for unkeyed reads and for batches (GatewaySettings.issuer_routing)
        self._rr = itertools.cycle(range(len(self.issuers)))

    @classmethod
    def from_settings(cls, settings: GatewaySettings) -> Forwarder:
        """The issuers and the wallet of `settings`, with its pool, timeout and breakers."""
        return cls(
            settings.issuer_urls,
            settings.wallet_url,
            connections=settings.upstream_connections,
            timeout_seconds=settings.upstream_timeout_seconds,
            failure_threshold=settings.breaker_failures,
            open_seconds=settings.breaker_open_seconds,
        )

    def pick_issuer(self, affinity: str | None = None) -> Upstream:
        """The issuer for a request whose breaker lets it through.

        With `affinity` (the shopper's id) the choice starts at the issuer that user hashes to,
        the same on every gateway replica: a retry of a won request then reaches the issuer
        whose replay cache holds the coupon rather than one that must ask Redis for it.
        Without it, round-robin. Either way an issuer whose breaker is open is skipped.
        """
        now = time.monotonic()
        n = len(self.issuers)
        start = next(self._rr) if affinity is None else issuer_index(affinity, n)
        for step in range(n):
            up = self.issuers[(start + step) % n]
            if up.breaker.try_acquire(now):
                if up.breaker.state is not State.CLOSED:
                    up.publish_state()
                return up
        wait = min(u.breaker.retry_after(now) for u in self.issuers)
        raise unavailable("the issuer is unavailable; retry later", wait, "breaker_open")

    def acquire_wallet(self) -> Upstream:
        now = time.monotonic()
        if not self.wallet.breaker.try_acquire(now):
            wait = self.wallet.breaker.retry_after(now)
            raise unavailable("the wallet is unavailable; retry later", wait, "breaker_open")
        return self.wallet

    def send_now(
        self, up: Upstream, method: str, path: str, headers: Mapping[str, str], body: bytes
    ) -> Sent | None:
        """Write the request to `up` in this loop turn when its pool has an idle connection
        (HTTPPool.send_now): pass the result to `call`, which reads the answer. None: `call`
        sends it."""
        return up.pool.send_now(method, path, self._with_deadline(headers), body)

    def _with_deadline(self, headers: Mapping[str, str]) -> dict[str, str]:
        return {**headers, DEADLINE_HEADER: self._deadline_ms}

    async def call(
        self,
        up: Upstream,
        method: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes | None = None,
        sent: Sent | None = None,
    ) -> Answer:
        """One upstream request through `up`, whose breaker the caller acquired; `sent`, the
        same request already written by `send_now`."""
        start = time.perf_counter()
        try:
            if sent is not None:
                response = await up.pool.answer(sent, deadline_seconds=self.timeout)
            else:
                response = await up.pool.request(
                    method, path, self._with_deadline(headers), body, deadline_seconds=self.timeout
                )
            status, _, raw_headers, content = response
        except TimeoutError:
            self._failed(up, start, "timeout")
            raise unavailable(
                f"the {up.kind} did not answer in time", 1, "upstream_timeout"
            ) from None
        except ProtocolError as exc:
            self._failed(up, start, "error")
            logger.warning("%s %s failed: %s", up.kind, up.base_url, exc)
            raise unavailable(f"the {up.kind} is unreachable", 1, "upstream_error") from None
        except UnsafeRequestError as exc:
            up.breaker.on_abandoned()  # nothing was sent: the upstream was not tried
            raise invalid_characters(exc) from None
        except BaseException:
            up.breaker.on_abandoned()  # cancelled (client went away): not the upstream's fault
            raise
        up.observe(status, time.perf_counter() - start)
        judged = verdict(status)
        if judged is Verdict.FAILURE:
            up.breaker.on_failure(time.monotonic())
            up.publish_state()
        elif judged is Verdict.NEUTRAL:
            up.breaker.on_abandoned()  # a half-open probe answered 503: let another probe
        else:
            was = up.breaker.state
            up.breaker.on_success()
            if was is not State.CLOSED:
                up.publish_state()
        return answer_of(up, method, path, status, raw_headers, content)

    def _failed(self, up: Upstream, start: float, outcome: str) -> None:
        UPSTREAM_DURATION.labels(up.kind, outcome).observe(time.perf_counter() - start)
        up.breaker.on_failure(time.monotonic())
        up.publish_state()

    async def aclose(self) -> None:
        for up in [*self.issuers, self.wallet]:
            await up.pool.aclose()
