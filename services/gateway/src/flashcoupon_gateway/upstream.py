"""Forwarding to the issuer (round-robin over replicas) and the wallet, with load shedding.

Every call goes over a pooled keep-alive connection (one httpx.AsyncClient with connection
limits), has a timeout, and passes its upstream's circuit breaker. 5xx answers, timeouts and
connection errors count as failures; 4xx answers (SOLD_OUT, DUPLICATE, ...) are the upstream
working correctly. With every issuer's breaker open, the answer is 503 + Retry-After at once.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass

import httpx
from flashcoupon_common.http import ProblemError

from flashcoupon_gateway.breaker import Breaker, State, retry_after_header
from flashcoupon_gateway.metrics import BREAKER_STATE, SHED, UPSTREAM_DURATION

logger = logging.getLogger(__name__)

# Response headers worth passing back to the shopper.
_PASS_HEADERS = ("content-type", "retry-after", "location", "idempotency-key")


@dataclass(frozen=True, slots=True)
class Answer:
    status: int
    body: bytes
    headers: dict[str, str]


def unavailable(detail: str, retry_after: float, reason: str) -> ProblemError:
    SHED.labels(reason).inc()
    return ProblemError(
        503,
        "SERVICE_UNAVAILABLE",
        detail,
        headers={"Retry-After": retry_after_header(retry_after)},
    )


class Upstream:
    """One upstream base URL and its breaker."""

    def __init__(self, kind: str, base_url: str, breaker: Breaker) -> None:
        self.kind = kind
        self.base_url = base_url
        self.breaker = breaker

    def publish_state(self) -> None:
        BREAKER_STATE.labels(self.base_url).set(int(self.breaker.state))


class Forwarder:
    def __init__(
        self,
        issuer_urls: tuple[str, ...],
        wallet_url: str,
        *,
        client: httpx.AsyncClient,
        timeout_seconds: float,
        failure_threshold: int,
        open_seconds: float,
    ) -> None:
        def make(kind: str, url: str) -> Upstream:
            up = Upstream(kind, url, Breaker(failure_threshold, open_seconds))
            up.publish_state()
            return up

        self.issuers = [make("issuer", u) for u in issuer_urls]
        self.wallet = make("wallet", wallet_url)
        self.client = client
        self.timeout = timeout_seconds
        self._rr = itertools.cycle(range(len(self.issuers)))

    def pick_issuer(self) -> Upstream:
        """The next issuer (round-robin) whose breaker lets a request through."""
        now = time.monotonic()
        for _ in range(len(self.issuers)):
            up = self.issuers[next(self._rr)]
            if up.breaker.try_acquire(now):
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

    async def call(
        self,
        up: Upstream,
        method: str,
        path: str,
        headers: Mapping[str, str],
        body: bytes | None = None,
    ) -> Answer:
        """One upstream request through `up`, whose breaker was acquired by the caller."""
        start = time.perf_counter()
        outcome = "error"
        try:
            response = await self.client.request(
                method,
                up.base_url + path,
                headers=dict(headers),
                content=body,
                timeout=self.timeout,
            )
            outcome = f"{response.status_code // 100}xx"
        except httpx.TimeoutException:
            outcome = "timeout"
            up.breaker.on_failure(time.monotonic())
            raise unavailable(
                f"the {up.kind} did not answer in time", 1, "upstream_timeout"
            ) from None
        except httpx.HTTPError as exc:
            up.breaker.on_failure(time.monotonic())
            logger.warning("%s %s failed: %s", up.kind, up.base_url, exc)
            raise unavailable(f"the {up.kind} is unreachable", 1, "upstream_error") from None
        except BaseException:
            up.breaker.on_abandoned()
            raise
        finally:
            UPSTREAM_DURATION.labels(up.kind, outcome).observe(time.perf_counter() - start)
            up.publish_state()
        if response.status_code >= 500:
            up.breaker.on_failure(time.monotonic())
            up.publish_state()
        else:
            up.breaker.on_success()
            if up.breaker.state is not State.CLOSED:
                up.publish_state()
        passed = {k: v for k, v in response.headers.items() if k.lower() in _PASS_HEADERS}
        return Answer(response.status_code, response.content, passed)
