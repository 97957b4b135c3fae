"""Names no other test uses (event ids, topics, databases, consumer groups).

Tests share the local stack's servers; a random name per test keeps them from seeing each
other's data (STYLE.md habit 10).
"""

from __future__ import annotations

import uuid


def random_name(prefix: str) -> str:
    """A name no other test uses: lowercase, Kubernetes- and MySQL-safe."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"
