"""RED metrics per route (rate, errors, duration): a pure ASGI middleware for ordinary routes,
and RouteMetrics for the hot routes served outside Starlette (the issuer's IssueEdge, the
gateway's IssueFastPath), recorded under the same names and labels.

Labels use the route *template* (`/v1/events/{eventId}/issue`), never the raw path, so an
attacker cannot blow up the series count with random URLs. Both families are tallies
(flashcoupon_common.tally): recorded without a lock, from the event loop's thread.
"""

from __future__ import annotations

import time
from typing import Any, Generic, TypeVar

from prometheus_client import Counter, Gauge, Histogram
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from flashcoupon_common.tally import CounterTally, HistogramTally

HTTP_REQUESTS = CounterTally(
    "flashcoupon_http_requests_total",
    "HTTP requests by service, route template, method and status",
    ["service", "route", "method", "status"],
)
HTTP_DURATION = HistogramTally(
    "flashcoupon_http_request_duration_seconds",
    "HTTP request duration by service and route template",
    ["service", "route", "method"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)


M = TypeVar("M", Counter, Gauge, Histogram, CounterTally, HistogramTally)


class Children(Generic[M]):
    """A metric's label children, each created once.

    prometheus_client's `labels()` takes a lock and builds a tuple per call, which shows on a
    hot path (a tally's is cheaper, still a lookup). Use only
    with bounded label values (status codes, route templates, events that exist), and
    `forget()` an event's series when the event goes away.
    """

    def __init__(self, metric: M) -> None:
        self._metric: M = metric
        self._cache: dict[tuple[str, ...], Any] = {}

    def __call__(self, *values: str) -> Any:
        child = self._cache.get(values)
        if child is None:
            child = self._cache[values] = self._metric.labels(*values)
        return child

    def has(self, *values: str) -> bool:
        return values in self._cache

    def forget(self, *values: str) -> None:
        """Remove the series whose labels start with `values` (e.g. every series of an event)."""
        n = len(values)
        for key in [k for k in self._cache if k[:n] == values]:
            del self._cache[key]
            self._metric.remove(*key)


class RouteMetrics:
    """RED metrics of one hot route, as REDMiddleware records them for ordinary routes."""

    def __init__(self, service: str, route: str, method: str) -> None:
        self._requests: dict[int, Any] = {}  # status -> its counter child
        self._labels = (service, route, method)
        self._duration = HTTP_DURATION.labels(service, route, method)

    def record(self, status: int, started: float) -> None:
        """One request answered with `status`; `started` is its time.perf_counter() start."""
        child = self._requests.get(status)
        if child is None:
            child = self._requests[status] = HTTP_REQUESTS.labels(*self._labels, str(status))
        child.inc()
        self._duration.observe(time.perf_counter() - started)


class REDMiddleware:
    def __init__(self, app: ASGIApp, service: str) -> None:
        self.app = app
        self.service = service

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        route = _template(scope)
        status = 500
        start = time.perf_counter()

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        finally:
            method = scope["method"]
            HTTP_REQUESTS.labels(self.service, route, method, str(status)).inc()
            HTTP_DURATION.labels(self.service, route, method).observe(time.perf_counter() - start)


def _template(scope: Scope) -> str:
    app = scope.get("app")
    for route in getattr(getattr(app, "router", None), "routes", ()):
        match, _ = route.matches(scope)
        if match == Match.FULL:
            return getattr(route, "path", "other")
    return "unmatched"
