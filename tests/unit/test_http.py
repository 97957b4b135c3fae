from __future__ import annotations

import httpx
from flashcoupon_common.http import (
    JSONResponse,
    ProblemError,
    exception_handlers,
    health_routes,
    json_body,
)
from flashcoupon_common.red_metrics import REDMiddleware
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route

from tests.support.asgi import client as asgi_client


async def echo(request: Request) -> JSONResponse:
    return JSONResponse(await json_body(request, max_bytes=64))


async def boom(request: Request) -> JSONResponse:
    raise RuntimeError("bug")


async def teapot(request: Request) -> JSONResponse:
    raise ProblemError(409, "DUPLICATE", "already issued", couponCode="X")


async def ready() -> dict[str, bool]:
    return {"redis": True, "kafka": False}


def client() -> httpx.AsyncClient:
    app = Starlette(
        routes=[
            Route("/echo", echo, methods=["POST"]),
            Route("/boom", boom),
            Route("/dup", teapot),
            *health_routes(ready),
        ],
        exception_handlers=exception_handlers(),
    )
    app.add_middleware(REDMiddleware, service="test")
    return asgi_client(app, "http://t", raise_app_exceptions=False)


async def test_problem_json_for_domain_errors_and_framework_errors() -> None:
    async with client() as c:
        r = await c.get("/dup")
        assert r.status_code == 409
        assert r.headers["content-type"] == "application/problem+json"
        assert r.json()["code"] == "DUPLICATE" and r.json()["couponCode"] == "X"
        r = await c.get("/nope")
        assert (r.status_code, r.json()["code"]) == (404, "NOT_FOUND")
        r = await c.post("/dup")
        assert (r.status_code, r.json()["code"]) == (405, "METHOD_NOT_ALLOWED")
        r = await c.get("/boom")
        assert r.status_code == 500 and "bug" not in r.text and r.json()["code"] == "INTERNAL"


async def test_json_body_rejects_bad_input_with_4xx() -> None:
    async with client() as c:
        assert (await c.post("/echo", content=b"{bad")).json()["code"] == "MALFORMED_JSON"
        assert (await c.post("/echo", content=b"[1]")).status_code == 400
        assert (await c.post("/echo", content=b'{"a":"' + b"x" * 100 + b'"}')).status_code == 413
        assert (await c.post("/echo", json={"a": 1})).json() == {"a": 1}


async def test_readyz_reports_each_dependency_and_metrics_count_routes() -> None:
    async with client() as c:
        r = await c.get("/readyz")
        assert r.status_code == 503 and r.json()["checks"] == {"redis": True, "kafka": False}
        assert (await c.get("/healthz")).status_code == 200
        text = (await c.get("/metrics")).text
        assert (
            'flashcoupon_http_requests_total{method="GET",route="/readyz",service="test",status="503"}'
            in text
        )


def test_json_response_heads_as_starlette_would() -> None:
    """JSONResponse sets its own two headers for the common answer: byte for byte what
    Starlette's Response would send, for every status, with and without headers of its own."""
    import orjson
    from starlette.responses import Response

    content = {"couponCode": "ABCD", "tier": "big", "n": [1, 2]}
    for status in (100, 200, 201, 204, 304, 409, 503):
        for headers in (None, {"Retry-After": "1"}):
            ours = JSONResponse(content, status, headers=headers)
            theirs = Response(
                orjson.dumps(content), status, headers=headers, media_type="application/json"
            )
            _assert_same_head(ours, theirs, (status, headers))


def test_a_reply_heads_as_starlette_would() -> None:
    """Reply (the gateway's relayed answers, sent as ASGI messages or as a route's Response)
    carries byte for byte the head Starlette's Response would: names lower-cased, Latin-1,
    Content-Length added unless the status is body-less."""
    from flashcoupon_common.http import Reply
    from starlette.responses import Response

    body = b'{"couponCode":"ABCD"}'
    heads: list[dict[str, str]] = [
        {},
        {"content-type": "application/json", "RateLimit-Limit": "5", "RateLimit-Reset": "1"},
        {"Content-Type": "application/problem+json", "Retry-After": "2", "X-Name": "jos\xe9"},
    ]
    for status in (100, 200, 201, 204, 304, 409, 410, 503):
        for headers in heads:
            raw = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
            reply = Reply.of(status, raw, body)
            theirs = Response(body, status, headers=headers)
            _assert_same_head(reply.response(), theirs, (status, headers))
            assert Reply.of_response(theirs) == reply


async def test_a_reply_is_sent_as_two_asgi_messages() -> None:
    from flashcoupon_common.http import Reply

    sent: list[dict[str, object]] = []

    async def send(message: dict[str, object]) -> None:
        sent.append(message)

    await Reply.of(201, [(b"content-type", b"application/json")], b"{}").send(send)
    assert sent == [
        {
            "type": "http.response.start",
            "status": 201,
            "headers": [(b"content-type", b"application/json"), (b"content-length", b"2")],
        },
        {"type": "http.response.body", "body": b"{}"},
    ]


def _assert_same_head(ours: object, theirs: object, case: object) -> None:
    from starlette.responses import Response

    assert isinstance(ours, Response) and isinstance(theirs, Response)
    assert (ours.status_code, ours.body, ours.raw_headers) == (
        theirs.status_code,
        theirs.body,
        theirs.raw_headers,
    ), case
    assert ours.background is None
