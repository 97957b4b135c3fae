"""Free TCP ports on 127.0.0.1 for servers the tests start.

`free_port` is the one the local run of the services uses (flashcoupon_loadtest.localrun): a
port below the kernel's ephemeral range that is free now, so no outgoing connection can take it
before the server binds it; another server could, and the tests that start servers fail loudly
(not ready) when that happens.
"""

from __future__ import annotations

import socket

from flashcoupon_loadtest.localrun import free_port

__all__ = ["free_port", "free_port_pair", "port_is_free"]


def port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def free_port_pair(offset: int = 100) -> int:
    """A port p such that p and p+offset are free (Kafka uses base and controller ports)."""
    for _ in range(50):
        port = free_port()
        if port < 60000 and all(port_is_free(p) for p in (port, port + offset)):
            return port
    raise RuntimeError("no free port pair found")
