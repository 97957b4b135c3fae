"""RED metrics per route (rate, errors, duration) as a pure ASGI middleware.

Labels use the route *template* (`/v1/events/{eventId}/issue`), never the raw path, so an
attacker cannot blow up the series count with random URLs.
"""

from __future__ import annotations

import time

from prometheus_client import Counter, Histogram
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

HTTP_REQUESTS = Counter(
    "flashcoupon_http_requests_total",
    "HTTP requests by service, route template, method and status",
    ["service", "route", "method", "status"],
)
HTTP_DURATION = Histogram(
    "flashcoupon_http_request_duration_seconds",
    "HTTP request duration by service and route template",
    ["service", "route", "method"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)


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
