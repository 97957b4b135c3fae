"""The issuer's HTTP edge: parse, call IssueService, map the Outcome to the HTTP contract.

The user id comes only from X-Flashcoupon-User, which the gateway sets (and strips from
clients); the issuer is not reachable from outside the cluster.
"""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime
from typing import Any

from flashcoupon_common import event_state
from flashcoupon_common.http import JSONResponse, ProblemError, problem
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from flashcoupon_issuer.issuance import Coupon, IssuerUnavailable, IssueService, Outcome

USER_HEADER = "x-flashcoupon-user"
MAX_USER_LEN = 128  # user_coupons.user_id is VARCHAR(128)
# Request ids live inside the users-hash value, whose separators are ',' and ';'.
IDEMPOTENCY_RE = re.compile(r"^[A-Za-z0-9_.:\-]{1,64}$")
TRACEPARENT_RE = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")


def iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


def coupon_json(event_id: str, user_id: str, c: Coupon) -> dict[str, Any]:
    return {
        "eventId": event_id,
        "userId": user_id,
        "couponCode": c.code,
        "tier": c.tier,
        "discount": c.discount.to_json(),
        "issuedAt": iso(c.issued_at_ms),
        "expiresAt": iso(c.expires_at_ms),
    }


def outcome_response(event_id: str, user_id: str, o: Outcome) -> Response:
    if o.status == "ISSUED":
        headers = {"Idempotent-Replayed": "true"} if o.replay else None
        return JSONResponse(coupon_json(event_id, user_id, o.coupons[0]), 201, headers=headers)
    if o.status == "SOLD_OUT":
        return problem(410, "SOLD_OUT", f"event {event_id} is sold out")
    if o.status == "DUPLICATE":
        held = [coupon_json(event_id, user_id, c) for c in o.coupons]
        return problem(
            409,
            "DUPLICATE",
            f"user already holds {len(held)} coupon(s) of event {event_id}, the limit",
            coupon=held[-1],
            coupons=held,
        )
    if o.status == "NOT_STARTED":
        return problem(
            409, "NOT_STARTED", f"event {event_id} has not started", startAt=iso(o.at_ms or 0)
        )
    if o.status == "ENDED":
        return problem(409, "ENDED", f"event {event_id} has ended", endAt=iso(o.at_ms or 0))
    if o.status == "PAUSED":
        return problem(423, "PAUSED", f"event {event_id} is paused", headers={"Retry-After": "5"})
    if o.status == "NOT_FOUND":
        return problem(404, "EVENT_NOT_FOUND", f"no event {event_id}")
    if o.status == "NOT_DURABLE":
        return problem(
            503,
            "NOT_DURABLE",
            "the coupon was taken but no replica confirmed it in time; retry with the same "
            "Idempotency-Key to receive it",
            headers={"Retry-After": "1"},
        )
    raise AssertionError(f"unmapped outcome {o.status}")


def _event_id(request: Request) -> str:
    event_id: str = request.path_params["eventId"]
    if not event_state.EVENT_ID_RE.match(event_id):
        raise ProblemError(
            400, "INVALID_EVENT_ID", "event id must be a DNS-1123 label (a-z, 0-9, '-', max 63)"
        )
    return event_id


async def issue(request: Request) -> Response:
    event_id = _event_id(request)
    headers = request.headers
    user = headers.get(USER_HEADER)
    if not user:
        raise ProblemError(400, "MISSING_USER", "header X-Flashcoupon-User is required")
    if len(user) > MAX_USER_LEN or not user.isprintable():
        raise ProblemError(
            400, "INVALID_USER", f"X-Flashcoupon-User must be printable, max {MAX_USER_LEN} chars"
        )
    key = headers.get("idempotency-key")
    if key is not None and not IDEMPOTENCY_RE.match(key):
        raise ProblemError(
            400, "INVALID_IDEMPOTENCY_KEY", "Idempotency-Key must be 1-64 of A-Z a-z 0-9 _ . : -"
        )
    tp = headers.get("traceparent", "")
    if tp and not TRACEPARENT_RE.match(tp):
        tp = ""  # a malformed trace context is dropped, not an error (W3C trace-context)
    service: IssueService = request.state.service
    try:
        outcome = await service.issue(
            event_id, user, key or os.urandom(10).hex(), tp, keyed=key is not None
        )
    except IssuerUnavailable:
        raise ProblemError(
            503, "UNAVAILABLE", "coupon store unreachable; retry", headers={"Retry-After": "1"}
        ) from None
    return outcome_response(event_id, user, outcome)


async def event_status(request: Request) -> Response:
    event_id = _event_id(request)
    state = await event_state.read_state(request.state.redis, event_id)
    if state is None:
        raise ProblemError(404, "EVENT_NOT_FOUND", f"no event {event_id}")
    return JSONResponse(
        {
            "eventId": event_id,
            "phase": state.phase(),
            "startAt": iso(event_state.to_ms(state.start_at)),
            "endAt": iso(event_state.to_ms(state.end_at)),
            "quantity": state.quantity,
            "remaining": state.remaining,
        }
    )


def routes() -> list[Route]:
    return [
        Route("/internal/v1/events/{eventId}/issue", issue, methods=["POST"]),
        Route("/v1/events/{eventId}", event_status, methods=["GET"]),
    ]
