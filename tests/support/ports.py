"""Free TCP ports on 127.0.0.1 for servers the tests start.

`free_port` is the one the local run of the services uses (flashcoupon_loadtest.localrun): a
port below the kernel's ephemeral range that is free now, so no outgoing connection can take it
before the server binds it; another server could, and the tests that start servers fail loudly
(not ready) when that happens. `free_port_run` is the private stacks' (a run of ports, with
their cluster bus or controller ports), from a range of its own below the ephemeral one too.
"""

from __future__ import annotations

from flashcoupon_loadtest.localrun import free_port, free_port_run

__all__ = ["free_port", "free_port_run"]
