"""Every process refuses to start without its connection settings, in one line, no traceback.

Outside FLASHCOUPON_ENV=local the Redis, Kafka and MySQL settings have no defaults: a
Deployment that forgot one must stop at start-up naming the variable, not dial 127.0.0.1 and
fail at first use (or, for the operator, retry a start-up activity forever).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

SECRET = "0123456789abcdef0123456789abcdef"  # the gateway's JWT secret is checked first


@pytest.mark.parametrize(
    ("module", "variable"),
    [
        ("flashcoupon_gateway", "FLASHCOUPON_REDIS_NODES"),
        ("flashcoupon_issuer", "FLASHCOUPON_REDIS_NODES"),
        ("flashcoupon_relay", "FLASHCOUPON_REDIS_NODES"),
        ("flashcoupon_persister", "FLASHCOUPON_KAFKA_BOOTSTRAP"),
        ("flashcoupon_wallet", "FLASHCOUPON_MYSQL_URL"),
        ("flashcoupon_operator", "FLASHCOUPON_REDIS_NODES"),
    ],
)
def test_a_missing_connection_setting_stops_start_up_naming_it(module: str, variable: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", module],
        env={"PATH": "/usr/bin:/bin", "FLASHCOUPON_GATEWAY_JWT_SECRET": SECRET},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode != 0
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert len(lines) == 1 and f"{variable} is required but not set" in lines[0], lines
    assert "Traceback" not in lines[0]
