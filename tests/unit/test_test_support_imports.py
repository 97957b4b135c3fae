"""Test modules share helpers through tests/support only, never by importing each other.

A test module imported by another runs twice under two names (pytest imports it by path,
the importer by package), so its module-level state — a random secret, a metric — exists
twice; and a helper hidden in a test file is found by nobody. tests/support is the one place.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
# What a test module or a support module may import from the tests package.
ALLOWED = ("tests.support",)


def imports_of(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level:
            found.append((node.lineno, "." * node.level + (node.module or "")))
    return found


def forbidden(module: str) -> bool:
    """A relative import, or one of the tests package outside tests.support (conftest too)."""
    own = module == "tests" or module.startswith("tests.")
    return module.startswith(".") or (own and not module.startswith(ALLOWED))


def test_test_modules_import_helpers_only_from_tests_support() -> None:
    offences = [
        f"{path.relative_to(TESTS.parent)}:{line} imports {module}"
        for path in sorted(TESTS.rglob("*.py"))
        for line, module in imports_of(path)
        if forbidden(module)
    ]
    assert offences == [], "move shared helpers to tests/support:\n" + "\n".join(offences)


@pytest.mark.parametrize(
    ("source", "allowed"),
    [
        ("from tests.support.ports import free_port", True),
        ("import tests.support.polling", True),
        ("from flashcoupon_common import keys", True),
        ("from tests.integration.test_wallet_api import add_event", False),
        ("import tests.e2e.test_gateway_e2e", False),
        ("from tests.conftest import random_name", False),
        ("from .test_reconcile_plan import spec", False),
    ],
)
def test_the_check_tells_support_imports_from_cross_test_imports(
    tmp_path: Path, source: str, allowed: bool
) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(source + "\n")
    assert [forbidden(m) for _, m in imports_of(probe)] == [not allowed]
