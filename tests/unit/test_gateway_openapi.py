"""The OpenAPI document covers every route and matches the committed docs/openapi.json."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import orjson
import pytest
from flashcoupon_common import validation
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


# --- the document against the code that enforces it -------------------------------------------

ROOT = Path(__file__).parents[2]
# Every module that builds a problem answer a shopper can receive through the gateway (the
# gateway relays the issuer's and the wallet's answers as they are).
EMITTERS = [
    *sorted((ROOT / "services/gateway/src/flashcoupon_gateway").glob("*.py")),
    ROOT / "services/issuer/src/flashcoupon_issuer/http.py",
    *sorted((ROOT / "services/persister/src/flashcoupon_wallet").glob("*.py")),
    ROOT / "libs/common/src/flashcoupon_common/http.py",
    ROOT / "libs/common/src/flashcoupon_common/httpserver.py",
    ROOT / "libs/common/src/flashcoupon_common/validation.py",
]
# Codes no shopper can receive, and why.
INTERNAL = {
    (400, "MISSING_USER"),  # the gateway always sets X-Flashcoupon-User
    (400, "INVALID_USER"),  # the gateway's token check admits only ids the services accept
    (400, "MALFORMED_BATCH"),  # the gateway writes the batches (flashcoupon_common.issue_batch)
    (400, "MALFORMED_ALLOWANCE"),  # and the allowance header (the same module)
    (500, "INTERNAL"),  # a bug, never part of the contract
}


def _const(node: ast.expr, names: dict[str, object]) -> object:
    """A literal, or a module-level constant (validation.py names its codes)."""
    if isinstance(node, ast.Constant):
        return node.value
    return names.get(node.id) if isinstance(node, ast.Name) else None


def emitted_problems() -> set[tuple[int, str]]:
    """(status, code) of every `ProblemError(s, "CODE", …)` / `problem(s, "CODE", …)` call (the
    issuer's `_problem`, a problem as a Reply, too; and
    the HTTP server's `_reject(s, "CODE", …)`, answered before any app runs), and
    every exception class with `status = s` and `code = "CODE"` in the emitting modules."""
    found: set[tuple[int, str]] = set()
    for path in EMITTERS:
        tree = ast.parse(path.read_text(), str(path))
        names = {
            t.id: node.value.value
            for node in tree.body
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
            for t in node.targets
            if isinstance(t, ast.Name) and isinstance(node.value.value, str)
        }

        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and len(node.args) >= 2:
                func = node.func
                name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
                status, code = _const(node.args[0], names), _const(node.args[1], names)
                emits = name in ("ProblemError", "problem", "_problem", "_reject")
                if emits and isinstance(status, int):
                    assert isinstance(code, str), f"{path.name}:{node.lineno}: code not a literal"
                    found.add((status, code))
            elif isinstance(node, ast.ClassDef):
                attrs = {
                    t.id: stmt.value.value
                    for stmt in node.body
                    if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Constant)
                    for t in stmt.targets
                    if isinstance(t, ast.Name)
                }
                if isinstance(attrs.get("status"), int) and isinstance(attrs.get("code"), str):
                    found.add((attrs["status"], attrs["code"]))
    return found


def documented_problems() -> set[tuple[int, str]]:
    found: set[tuple[int, str]] = set()
    for operations in OPENAPI["paths"].values():
        for op in operations.values():
            for status, response in op["responses"].items():
                schema = response.get("content", {}).get("application/problem+json", {})
                for part in schema.get("schema", {}).get("allOf", []):
                    for code in part.get("properties", {}).get("code", {}).get("enum", []):
                        found.add((int(status), code))
    return found


def test_scan_sees_the_known_problems() -> None:
    # Guards the scan itself: if these vanish, the scan is broken, not the services fixed.
    assert {(423, "PAUSED"), (400, "INVALID_EVENT_ID"), (422, "INVALID_REQUEST")} <= (
        emitted_problems()
    )


def test_every_emitted_problem_is_documented_under_its_status() -> None:
    missing = emitted_problems() - INTERNAL - documented_problems()
    assert not missing, f"document these in flashcoupon_gateway/openapi.py: {sorted(missing)}"


def test_the_document_lists_no_problem_the_code_cannot_answer() -> None:
    stale = documented_problems() - emitted_problems()
    assert not stale, f"documented but never answered (wrong status or name?): {sorted(stale)}"


def _doc_accepts(schema: dict[str, Any], value: str) -> bool:
    # ECMA-262 `$` matches only at the end of the input: Python's equivalent is \Z.
    pattern = schema["pattern"].removesuffix("$") + r"\Z"
    return (
        schema["minLength"] <= len(value) <= schema["maxLength"]
        and re.search(pattern, value) is not None
    )


def _param(path: str, method: str, name: str) -> dict[str, Any]:
    params = OPENAPI["paths"][path][method]["parameters"]
    return next(p["schema"] for p in params if p["name"] == name)


@pytest.mark.parametrize(
    ("schema", "rule", "samples"),
    [
        (
            _param("/v1/events/{eventId}/issue", "post", "eventId"),
            validation.EVENT_ID,
            ["qa-e", "qa-e\n", "a" * 63, "a" * 64, "Qa", "-a", "a-", "a--b", ""],
        ),
        (
            _param("/v1/events/{eventId}/issue", "post", "Idempotency-Key"),
            validation.IDEMPOTENCY_KEY,
            ["k1", "k1\n", "k" * 64, "k" * 65, "a,b", "a b", "A_.:-z", ""],
        ),
        (
            _param("/v1/coupons/{code}/redeem", "post", "code"),
            validation.COUPON_CODE,
            ["ABCD0123456789", "ABC\n", "A" * 32, "A" * 33, "a/b", ""],
        ),
    ],
)
def test_documented_patterns_accept_exactly_what_is_enforced(
    schema: dict[str, Any], rule: validation.Pattern, samples: list[str]
) -> None:
    for value in samples:
        assert _doc_accepts(schema, value) == rule.ok(value), repr(value)


def test_documented_redeem_body_matches_the_validators() -> None:
    props = OPENAPI["components"]["schemas"]["Redeem"]["properties"]
    order_id, amount = props["orderId"], props["orderAmount"]
    for value in ["o-1", "주문 7", "a" * 64, "a" * 65, "", "a\u0000b", "a\nb", "a\x7fb"]:
        if validation.printable_id(value):
            assert _doc_accepts(order_id, value), repr(value)  # never stricter than the code
        if not _doc_accepts(order_id, value):
            assert not validation.printable_id(value), repr(value)
    assert amount["type"] == "integer"
    assert (amount["minimum"], amount["maximum"]) == (1, validation.MAX_ORDER_AMOUNT)
    limit = _param("/v1/me/coupons", "get", "limit")
    assert (limit["minimum"], limit["maximum"]) == (1, validation.MAX_LIMIT)
    assert limit["default"] == validation.DEFAULT_LIMIT
