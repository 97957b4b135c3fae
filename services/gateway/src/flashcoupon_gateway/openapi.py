"""The public API's OpenAPI 3.1 document (served at /openapi.json, committed as docs/openapi.json).

Written by hand rather than generated, because the gateway's routes are plain Starlette routes;
a test checks every route of the app appears here and that docs/openapi.json matches.
"""

from __future__ import annotations

from typing import Any


def _problem(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {
            "application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}
        },
    }


def _retry(description: str) -> dict[str, Any]:
    return {
        **_problem(description),
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
    "schema": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"},
}
_AUTH_ERRORS = {
    "401": _problem("missing, invalid, expired or wrong-audience token (WWW-Authenticate)"),
    "429": _retry("RATE_LIMITED: a per-IP, per-user or per-event limit; RateLimit-* headers"),
    "503": _retry("SERVICE_UNAVAILABLE: upstream failing (breaker open) or gateway overloaded"),
}

OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {
        "title": "flashcoupon public API",
        "version": "1.0.0",
        "description": "First-come-first-served coupon drops, served by the flashcoupon gateway. "
        "Errors are RFC 9457 problem+json documents with a stable `code`.",
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
                    "state": {"enum": ["queued", "admitted", "gone"]},
                },
            },
            "EventState": {
                "type": "object",
                "properties": {
                    "eventId": {"type": "string"},
                    "phase": {"type": "string"},
                    "startAt": {"type": "string", "format": "date-time"},
                    "endAt": {"type": "string", "format": "date-time"},
                    "quantity": {"type": "integer"},
                    "remaining": {"type": "integer"},
                },
            },
            "Redeem": {
                "type": "object",
                "required": ["orderId", "orderAmount"],
                "properties": {"orderId": {"type": "string"}, "orderAmount": {"type": "number"}},
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
                        "schema": {"type": "string", "maxLength": 128},
                    },
                ],
                "responses": {
                    "201": _json("issued", "Issued"),
                    "202": _json("QUEUED: in the event's waiting room; follow statusUrl", "Queued"),
                    "400": _problem("malformed body or Idempotency-Key"),
                    "404": _problem("EVENT_NOT_FOUND"),
                    "409": _problem("DUPLICATE (with the held coupon), NOT_STARTED, ENDED, PAUSED"),
                    "410": _problem("SOLD_OUT"),
                    "413": _problem("PAYLOAD_TOO_LARGE"),
                    **_AUTH_ERRORS,
                },
            }
        },
        "/v1/events/{eventId}": {
            "get": {
                "summary": "Public state of the event (remaining may be approximate)",
                "parameters": [_EVENT_ID],
                "responses": {
                    "200": _json("the event's state", "EventState"),
                    "404": _problem("EVENT_NOT_FOUND"),
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
                    "404": _problem("TICKET_NOT_FOUND (not this user's) or NO_WAITING_ROOM"),
                    "410": _problem("TICKET_EXPIRED"),
                    **_AUTH_ERRORS,
                },
            }
        },
        "/v1/me/coupons": {
            "get": {
                "summary": "The shopper's coupons across events",
                "security": [{"bearer": []}],
                "responses": {"200": {"description": "coupons"}, **_AUTH_ERRORS},
            }
        },
        "/v1/coupons/{code}/redeem": {
            "post": {
                "summary": "Redeem a coupon against an order",
                "security": [{"bearer": []}],
                "parameters": [
                    {"name": "code", "in": "path", "required": True, "schema": {"type": "string"}}
                ],
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Redeem"}}
                    },
                },
                "responses": {
                    "200": {"description": "redeemed, with the discount applied"},
                    "400": _problem("malformed body"),
                    "403": _problem("not your coupon"),
                    "404": _problem("COUPON_NOT_FOUND"),
                    "409": _problem("already used"),
                    "410": _problem("expired"),
                    "413": _problem("PAYLOAD_TOO_LARGE"),
                    **_AUTH_ERRORS,
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
