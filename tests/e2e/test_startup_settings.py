"""Every process refuses to start without its connection settings, or with a malformed value,
in one line naming the variable, exit status 2, no traceback.

Outside FLASHCOUPON_ENV=local the Redis, Kafka and MySQL settings have no defaults: a
Deployment that forgot one must stop at start-up naming the variable, not dial 127.0.0.1 and
fail at first use (or, for the operator, retry a start-up activity forever).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

SECRET = "0123456789abcdef0123456789abcdef"  # the gateway's JWT secret is checked first


def _start(module: str, env: dict[str, str]) -> list[str]:
    proc = subprocess.run(
        [sys.executable, "-m", module],
        env={"PATH": "/usr/bin:/bin", "FLASHCOUPON_GATEWAY_JWT_SECRET": SECRET, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert proc.returncode == 2, (proc.returncode, lines)
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    return lines


@pytest.mark.parametrize(
    ("module", "variable"),
    [
        ("flashcoupon_gateway", "FLASHCOUPON_REDIS_NODES"),
        ("flashcoupon_issuer", "FLASHCOUPON_REDIS_NODES"),
        ("flashcoupon_relay", "FLASHCOUPON_REDIS_NODES"),
        ("flashcoupon_persister", "FLASHCOUPON_KAFKA_BOOTSTRAP"),
        ("flashcoupon_persister.replay", "FLASHCOUPON_KAFKA_BOOTSTRAP"),
        ("flashcoupon_wallet", "FLASHCOUPON_MYSQL_URL"),
        ("flashcoupon_operator", "FLASHCOUPON_REDIS_NODES"),
    ],
)
def test_a_missing_connection_setting_stops_start_up_naming_it(module: str, variable: str) -> None:
    (line,) = _start(module, {})
    assert f"{variable} is required but not set" in line


@pytest.mark.parametrize(
    ("module", "variable"),
    [
        ("flashcoupon_gateway", "FLASHCOUPON_GATEWAY_BODY_TIMEOUT_SECONDS"),
        ("flashcoupon_issuer", "FLASHCOUPON_ISSUER_PORT"),
        ("flashcoupon_relay", "FLASHCOUPON_RELAY_BATCH_SIZE"),
        ("flashcoupon_persister", "FLASHCOUPON_PERSISTER_MAX_BATCH"),
        ("flashcoupon_wallet", "FLASHCOUPON_WALLET_PORT"),
        ("flashcoupon_operator", "FLASHCOUPON_OPERATOR_METRICS_PORT"),
    ],
)
def test_a_malformed_setting_stops_start_up_naming_it(module: str, variable: str) -> None:
    (line,) = _start(module, {"FLASHCOUPON_ENV": "local", variable: "soon"})
    assert variable in line and "'soon'" in line
