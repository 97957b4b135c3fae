"""Environments for settings objects built in tests.

Connection settings have no defaults outside FLASHCOUPON_ENV=local, so a test that builds
settings from an explicit mapping starts from LOCAL: `from_env({**LOCAL, "X": "1"})`.
"""

from __future__ import annotations

LOCAL = {"FLASHCOUPON_ENV": "local"}
