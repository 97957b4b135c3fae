"""The OpenAPI document covers every route and matches the committed docs/openapi.json."""

from __future__ import annotations

from pathlib import Path

import orjson
from flashcoupon_gateway.app import create_app
from flashcoupon_gateway.openapi import OPENAPI
from flashcoupon_gateway.settings import GatewaySettings

from tests.support.env import LOCAL

DOC = Path(__file__).parents[2] / "docs" / "openapi.json"


def test_every_route_is_documented_with_its_methods() -> None:
    settings = GatewaySettings.from_env(
        {**LOCAL, "FLASHCOUPON_GATEWAY_JWT_SECRET": "u" * 8 + "0123456789abcdefghijklmnopqrstuv"}
    )
    app = create_app(settings).app  # the Starlette app behind the issue fast path
    for route in app.routes:
        path = getattr(route, "path", None)
        assert path in OPENAPI["paths"], path
        methods = {m.lower() for m in getattr(route, "methods", ()) if m != "HEAD"}
        assert methods <= set(OPENAPI["paths"][path]), (path, methods)


def test_committed_document_is_current() -> None:
    # Regenerate with: uv run python -m flashcoupon_gateway.openapi > docs/openapi.json
    assert orjson.loads(DOC.read_bytes()) == OPENAPI
