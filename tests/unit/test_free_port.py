"""free_port: server ports below the kernel's ephemeral range, never the same one twice in a row."""

from __future__ import annotations

import socket
from pathlib import Path

from flashcoupon_loadtest.localrun import SERVER_PORTS, free_port


def test_ports_come_from_below_the_ephemeral_range_and_do_not_repeat() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert SERVER_PORTS.stop <= low  # else free_port falls back to the kernel's pick
    ports = [free_port() for _ in range(50)]
    assert all(p in SERVER_PORTS for p in ports), ports
    assert len(set(ports)) == len(ports)  # one run's services are picked before any binds


def test_a_port_in_use_is_skipped() -> None:
    first = free_port()
    with socket.socket() as held:
        held.bind(("127.0.0.1", first))
        held.listen()
        # Walk the whole range once: the held port must never come back while it is bound.
        seen = {free_port() for _ in range(len(SERVER_PORTS) - 1)}
    assert first not in seen
