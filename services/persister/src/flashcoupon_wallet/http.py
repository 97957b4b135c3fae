"""The wallet's HTTP routes: parse, call one store function, map the result.

The user id comes from X-Flashcoupon-User, which only the gateway sets (it strips any copy a
client sends); the wallet is not exposed outside the cluster.
"""

from __future__ import annotations

import logging
from typing import Any

from flashcoupon_common import validation
from flashcoupon_common.http import (
    JSONResponse,
    ProblemError,
    json_body,
    problem,
    user_from_header,
)
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from flashcoupon_wallet import store
from flashcoupon_wallet.publisher import RedeemedPublisher
from flashcoupon_wallet.redemption import (
    MAX_USER_ID,
    CouponRow,
    RedemptionError,
    display_status,
    iso_utc,
    parse_request,
)
from flashcoupon_wallet.settings import WalletSettings

logger = logging.getLogger(__name__)

USER_HEADER = "X-Flashcoupon-User"


def user_id(request: Request) -> str:
    raw = request.headers.get(USER_HEADER, "")
    if not raw:
        raise ProblemError(401, "UNAUTHORIZED", f"missing {USER_HEADER} (set by the gateway)")
    user = user_from_header(raw)  # UTF-8, as the gateway sends it
    if user is None:
        raise ProblemError(400, "INVALID_USER", f"{USER_HEADER} must be UTF-8")
    if len(user) > MAX_USER_ID or not user.isprintable():
        raise ProblemError(
            400, "INVALID_USER", f"{USER_HEADER} must be printable, max {MAX_USER_ID} chars"
        )
    return user


def coupon_json(row: CouponRow) -> dict[str, Any]:
    out: dict[str, Any] = {
        "eventId": row.event_id,
        "couponCode": row.code,
        "tier": row.tier,
        "discount": row.discount.to_json(),
        "status": display_status(row),
        "issuedAt": iso_utc(row.issued_at),
        "expiresAt": iso_utc(row.expires_at),
    }
    if row.status == "redeemed" and row.redeemed_at is not None:
        out.update(
            redeemedAt=iso_utc(row.redeemed_at),
            orderId=row.order_id,
            discountAmount=row.discount_amount,
        )
    return out


async def my_coupons(request: Request) -> Response:
    user = user_id(request)
    limit = validation.limit(request.query_params.get("limit"))
    rows = await store.list_user_coupons(request.state.engine, user, limit)
    return JSONResponse({"userId": user, "coupons": [coupon_json(r) for r in rows]})


async def persisted(request: Request) -> Response:
    event_id = validation.event_id(request.path_params["eventId"])
    known, count, redeemed = await store.event_counts(request.state.engine, event_id)
    if not known:
        raise ProblemError(404, "EVENT_NOT_FOUND", f"no event {event_id} in MySQL")
    return JSONResponse({"eventId": event_id, "persisted": count, "redeemed": redeemed})


async def redeem(request: Request) -> Response:
    user = user_id(request)
    code = validation.coupon_code(request.path_params["code"])
    settings: WalletSettings = request.state.settings
    req = parse_request(await json_body(request, max_bytes=settings.max_body_bytes))
    result, fresh = await store.redeem(request.state.engine, user, code, req)
    if not fresh:
        return JSONResponse(result.to_json(), headers={"Idempotent-Replayed": "true"})
    # The coupon-redeemed event was committed with the redemption (the outbox); publishing it
    # is the publisher's job, which needs only a nudge.
    publisher: RedeemedPublisher = request.state.publisher
    publisher.wake()
    return JSONResponse(result.to_json())


async def on_redemption_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RedemptionError)
    return problem(exc.status, exc.code, exc.detail)


async def on_database_unavailable(request: Request, exc: Exception) -> Response:
    # MySQL unreachable or the pool exhausted: not the client's fault and not a bug; 503 with
    # Retry-After lets the gateway's breaker and the shopper's client back off.
    logger.warning("database unavailable on %s: %r", request.url.path, exc)
    return problem(
        503,
        "DB_UNAVAILABLE",
        "the coupon database is unavailable; retry shortly",
        headers={"Retry-After": "1"},
    )


routes = [
    Route("/v1/me/coupons", my_coupons, methods=["GET"]),
    Route("/v1/events/{eventId}/persisted", persisted, methods=["GET"]),
    Route("/v1/coupons/{code}/redeem", redeem, methods=["POST"]),
]
