"""The public API's OpenAPI 3.1 document (served at /openapi.json, committed as docs/openapi.json).

Written by hand rather than generated, because the gateway's routes are plain Starlette routes,
but every input rule comes from flashcoupon_common.validation, the module that enforces it.
tests/unit/test_gateway_openapi.py checks that every route appears here, that every problem
code the gateway, issuer and wallet can answer is listed under its status (and nothing else),
and that docs/openapi.json matches.

Over 300 lines on purpose: it is one document, mostly data (paths, schemas, problem codes);
split by path it would be harder to compare with the routes and docs/openapi.json.
"""

from __future__ import annotations

from typing import Any

from flashcoupon_common import validation


def _problem(description: str, *codes: str) -> dict[str, Any]:
    """A problem+json answer; `codes` are the stable codes it may carry (tested against the
    codes the services emit, tests/unit/test_gateway_openapi.py)."""
    return {
        "description": description,
        "content": {
            "application/problem+json": {
                "schema": {
                    "allOf": [
                        {"$ref": "#/components/schemas/Problem"},
                        {"properties": {"code": {"enum": list(codes)}}},
                    ]
                }
            }
        },
    }


def _retry(description: str, *codes: str) -> dict[str, Any]:
    return {
        **_problem(description, *codes),
        "headers": {"Retry-After": {"$ref": "#/components/headers/RetryAfter"}},
    }


def _json(description: str, schema: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}},
    }


_EVENT_ID = {
    "name": "eventId",
    "in": "path",
    "required": True,
    "schema": validation.EVENT_ID.schema,
}
_BAD_EVENT_ID = _problem(f"INVALID_EVENT_ID: not {validation.EVENT_ID.rule}", "INVALID_EVENT_ID")
_AUTH_ERRORS = {
    "401": _problem(
        "UNAUTHORIZED: missing, invalid, expired or wrong-audience token (WWW-Authenticate)",
        "UNAUTHORIZED",
    ),
    "429": _retry(
        "RATE_LIMITED: a per-IP, per-user or per-event limit; RateLimit-* headers", "RATE_LIMITED"
    ),
    "408": _problem(
        "REQUEST_TIMEOUT: the request's head or body did not arrive in time (the connection "
        "is closed)",
        "REQUEST_TIMEOUT",
    ),
    "502": _problem(
        "BAD_UPSTREAM: an internal service answered something that is not a problem document",
        "BAD_UPSTREAM",
    ),
    "503": _retry(
        "SERVICE_UNAVAILABLE: upstream failing (breaker open), gateway overloaded or a store "
        "unreachable; retrying is safe",
        "SERVICE_UNAVAILABLE",
    ),
}
_WALLET_UNAVAILABLE = _retry(
    "SERVICE_UNAVAILABLE (gateway, breaker) or DB_UNAVAILABLE (the coupon database); "
    "retrying is safe",
    "SERVICE_UNAVAILABLE",
    "DB_UNAVAILABLE",
)
_DESCRIPTION = (
    "First-come-first-served coupon drops, served by the flashcoupon gateway. "
    "Errors are RFC 9457 problem+json documents with a stable `code`.\n\n"
    "Bad input: a malformed path parameter, query parameter or header, or a body that is not "
    "a JSON object, is **400** with a code naming the part (`INVALID_EVENT_ID`, "
    "`INVALID_COUPON_CODE`, `INVALID_IDEMPOTENCY_KEY`, `INVALID_LIMIT`, `MALFORMED_JSON`); a "
    "JSON body whose fields are missing, of the wrong type or out of range is **422** "
    "`INVALID_REQUEST`, the detail naming the field. A well-formed id that names nothing is "
    "404.\n\n"
    "Discounts: `fixed` takes `amount` off; `percent` takes `floor(orderAmount × percent / "
    "100)`, capped at `maxAmount`, so small orders round down (5 % of 19 is 0: the coupon is "
    "spent for a 0 discount). A discount never exceeds the order."
)

OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {
        "title": "flashcoupon public API",
        "version": "1.0.0",
        "description": _DESCRIPTION,
    },
    "components": {
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "bearerFormat": "JWT"}},
        "headers": {
            "RetryAfter": {"schema": {"type": "integer"}, "description": "seconds to wait"},
        },
        "schemas": {
            "Problem": {
                "type": "object",
                "required": ["type", "title", "status", "code", "detail"],
                "properties": {
                    "type": {"type": "string"},
                    "title": {"type": "string"},
                    "status": {"type": "integer"},
                    "code": {"type": "string"},
                    "detail": {"type": "string"},
                },
            },
            "Discount": {
                "type": "object",
                "required": ["type"],
                "properties": {
                    "type": {"enum": ["fixed", "percent"]},
                    "amount": {"type": "integer"},
                    "percent": {"type": "number"},
                    "maxAmount": {"type": ["integer", "null"]},
                },
            },
            "Issued": {
                "type": "object",
                "required": [
                    "eventId",
                    "userId",
                    "couponCode",
                    "tier",
                    "discount",
                    "issuedAt",
                    "expiresAt",
                ],
                "properties": {
                    "eventId": {"type": "string"},
                    "userId": {"type": "string"},
                    "couponCode": {"type": "string"},
                    "tier": {"type": "string"},
                    "discount": {"$ref": "#/components/schemas/Discount"},
                    "issuedAt": {"type": "string", "format": "date-time"},
                    "expiresAt": {"type": "string", "format": "date-time"},
                },
            },
            "Queued": {
                "type": "object",
                "required": ["ticket", "position", "etaSeconds", "statusUrl"],
                "properties": {
                    "status": {"const": "QUEUED"},
                    "code": {"const": "QUEUED"},
                    "ticket": {"type": "string"},
                    "position": {"type": "integer"},
                    "etaSeconds": {"type": "integer"},
                    "statusUrl": {"type": "string"},
                },
            },
            "QueueStatus": {
                "type": "object",
                "required": ["ticket", "position", "etaSeconds", "state"],
                "properties": {
                    "ticket": {"type": "string"},
                    "position": {"type": "integer"},
                    "etaSeconds": {"type": "integer"},
                    "state": {"enum": ["queued", "admitted", "gone", "sold_out"]},
                },
            },
            "EventState": {
                "type": "object",
                "properties": {
                    "eventId": {"type": "string"},
                    # Paused is not a phase (docs/couponctl.md): it is reported beside it.
                    "phase": {"enum": ["Ready", "Active", "SoldOut", "Ended"]},
                    "paused": {"type": "boolean"},
                    "startAt": {"type": "string", "format": "date-time"},
                    "endAt": {"type": "string", "format": "date-time"},
                    "quantity": {"type": "integer"},
                    "remaining": {"type": "integer"},
                },
            },
            "Redeem": {
                "type": "object",
                "required": ["orderId", "orderAmount"],
                "properties": {
                    "orderId": validation.ORDER_ID_SCHEMA,
                    "orderAmount": validation.ORDER_AMOUNT_SCHEMA,
                },
            },
        },
    },
    "paths": {
        "/v1/events/{eventId}/issue": {
            "post": {
                "summary": "Get a coupon of the event",
                "security": [{"bearer": []}],
                "parameters": [
                    _EVENT_ID,
                    {
                        "name": "Idempotency-Key",
                        "in": "header",
                        "required": False,
                        "schema": validation.IDEMPOTENCY_KEY.schema,
                    },
                ],
                "responses": {
                    "201": _json("issued", "Issued"),
                    "202": _json("QUEUED: in the event's waiting room; follow statusUrl", "Queued"),
                    "400": _problem(
                        "a malformed event id, Idempotency-Key or body (the body is optional; "
                        "one that is sent must be a JSON object); INVALID_CHARACTERS: control "
                        "characters in the path or a forwarded header; MALFORMED_REQUEST: HTTP "
                        "the server cannot parse (e.g. a bad or repeated Content-Length)",
                        "INVALID_EVENT_ID",
                        "INVALID_IDEMPOTENCY_KEY",
                        "MALFORMED_JSON",
                        "INVALID_CHARACTERS",
                        "MALFORMED_REQUEST",
                    ),
                    "404": _problem("EVENT_NOT_FOUND: no such event", "EVENT_NOT_FOUND"),
                    "409": _problem(
                        "DUPLICATE (with the held coupon), NOT_STARTED (startAt), ENDED (endAt)",
                        "DUPLICATE",
                        "NOT_STARTED",
                        "ENDED",
                    ),
                    "410": _problem("SOLD_OUT", "SOLD_OUT"),
                    "413": _problem("PAYLOAD_TOO_LARGE", "PAYLOAD_TOO_LARGE"),
                    "423": _retry("PAUSED: issuing is paused by the operator", "PAUSED"),
                    **_AUTH_ERRORS,
                    "503": _retry(
                        "SERVICE_UNAVAILABLE (upstream failing, overloaded, a store "
                        "unreachable) or NOT_DURABLE (taken, but no replica confirmed it in "
                        "time; retry with the same Idempotency-Key to receive it)",
                        "SERVICE_UNAVAILABLE",
                        "NOT_DURABLE",
                    ),
                },
            }
        },
        "/v1/events/{eventId}": {
            "get": {
                "summary": "Public state of the event (remaining may be approximate)",
                "parameters": [_EVENT_ID],
                "responses": {
                    "200": _json("the event's state", "EventState"),
                    "400": _BAD_EVENT_ID,
                    "404": _problem("EVENT_NOT_FOUND: no such event", "EVENT_NOT_FOUND"),
                    "429": _AUTH_ERRORS["429"],
                    "503": _AUTH_ERRORS["503"],
                },
            }
        },
        "/v1/events/{eventId}/queue/{ticket}": {
            "get": {
                "summary": "A waiting-room ticket's position: JSON, or an SSE stream "
                "(Accept: text/event-stream) of `position` events until `admitted`, then the "
                "issue is performed for the shopper and sent as a final `result` event",
                "security": [{"bearer": []}],
                "parameters": [
                    _EVENT_ID,
                    {
                        "name": "ticket",
                        "in": "path",
                        "required": True,
                        "schema": {"type": "string"},
                    },
                ],
                "responses": {
                    "200": {
                        "description": "the ticket's state",
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/QueueStatus"}
                            },
                            "text/event-stream": {"schema": {"type": "string"}},
                        },
                    },
                    "400": _BAD_EVENT_ID,
                    "404": _problem(
                        "TICKET_NOT_FOUND (not this user's) or NO_WAITING_ROOM",
                        "TICKET_NOT_FOUND",
                        "NO_WAITING_ROOM",
                    ),
                    "410": _problem("TICKET_EXPIRED", "TICKET_EXPIRED"),
                    **_AUTH_ERRORS,
                },
            }
        },
        "/v1/me/coupons": {
            "get": {
                "summary": "The shopper's coupons across events",
                "security": [{"bearer": []}],
                "parameters": [
                    {
                        "name": "limit",
                        "in": "query",
                        "required": False,
                        "schema": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": validation.MAX_LIMIT,
                            "default": validation.DEFAULT_LIMIT,
                        },
                        "description": "newest first, at most this many",
                    }
                ],
                "responses": {
                    "200": {"description": "coupons, newest first (docs/wallet.md)"},
                    "400": _problem(
                        f"INVALID_LIMIT: limit is not an integer from 1 to {validation.MAX_LIMIT}",
                        "INVALID_LIMIT",
                    ),
                    **_AUTH_ERRORS,
                    "503": _WALLET_UNAVAILABLE,
                },
            }
        },
        "/v1/coupons/{code}/redeem": {
            "post": {
                "summary": "Redeem a coupon against an order",
                "security": [{"bearer": []}],
                "parameters": [
                    {
                        "name": "code",
                        "in": "path",
                        "required": True,
                        "schema": validation.COUPON_CODE.schema,
                    }
                ],
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Redeem"}}
                    },
                },
                "responses": {
                    "200": {
                        "description": "redeemed, with the discount applied (percent discounts "
                        "round down); a replay of the same orderId and amount answers the "
                        "stored result with Idempotent-Replayed: true"
                    },
                    "400": _problem(
                        "a malformed coupon code, or a body that is not a JSON object",
                        "INVALID_COUPON_CODE",
                        "MALFORMED_JSON",
                    ),
                    "403": _problem("NOT_YOUR_COUPON", "NOT_YOUR_COUPON"),
                    "404": _problem(
                        "COUPON_NOT_FOUND: no coupon has this code", "COUPON_NOT_FOUND"
                    ),
                    "409": _problem(
                        "ALREADY_REDEEMED: for another order, or this order with another amount",
                        "ALREADY_REDEEMED",
                    ),
                    "410": _problem("EXPIRED", "EXPIRED"),
                    "413": _problem("PAYLOAD_TOO_LARGE", "PAYLOAD_TOO_LARGE"),
                    "422": _problem(
                        "INVALID_REQUEST: orderId or orderAmount missing, of the wrong type or "
                        "out of range (the detail names the field)",
                        "INVALID_REQUEST",
                    ),
                    **_AUTH_ERRORS,
                    "503": _retry(
                        "SERVICE_UNAVAILABLE (gateway), DB_UNAVAILABLE or TRY_AGAIN (the row "
                        "changed twice under the request); retrying is safe",
                        "SERVICE_UNAVAILABLE",
                        "DB_UNAVAILABLE",
                        "TRY_AGAIN",
                    ),
                },
            }
        },
        "/openapi.json": {
            "get": {"summary": "This document", "responses": {"200": {"description": "OpenAPI"}}}
        },
        "/healthz": {"get": {"summary": "Liveness", "responses": {"200": {"description": "ok"}}}},
        "/readyz": {
            "get": {
                "summary": "Readiness (Redis reachable)",
                "responses": {"200": {"description": "ready"}, "503": {"description": "unready"}},
            }
        },
        "/metrics": {
            "get": {"summary": "Prometheus metrics", "responses": {"200": {"description": "text"}}}
        },
    },
}


if __name__ == "__main__":
    import sys

    import orjson

    sys.stdout.buffer.write(
        orjson.dumps(OPENAPI, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS) + b"\n"
    )
