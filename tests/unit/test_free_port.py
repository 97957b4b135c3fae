"""free_port: server ports below the kernel's ephemeral range, never the same one twice in a row;
free_port_run: a private stack's run of ports (and their bus ports), below it too."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from flashcoupon_loadtest import localrun
from flashcoupon_loadtest.localrun import PRIVATE_PORTS, SERVER_PORTS, free_port, free_port_run


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


def _ephemeral_low() -> int:
    return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


def test_a_private_run_and_its_bus_lie_below_the_ephemeral_range() -> None:
    for _ in range(20):
        base = free_port_run(6, offset=10000)
        assert PRIVATE_PORTS.start <= base and base + 6 <= PRIVATE_PORTS.stop
        assert base + 6 + 10000 <= min(_ephemeral_low(), 30000)  # nor in NodePorts
        assert base > 16383  # never a Redis slot number
        # Never in the shared stack's or a service's ports.
        assert not {*range(base, base + 6), *range(base + 10000, base + 10006)} & {
            *range(17000, 17006),
            *range(27000, 27006),
            19092,
            19192,
            13306,
            *SERVER_PORTS,
        }


def test_a_run_with_a_port_in_use_is_not_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    # A range of 8 whose bus port for one base is held: only runs clear of it come back.
    monkeypatch.setattr(localrun, "PRIVATE_PORTS", range(19800, 19808))
    with socket.socket() as held:
        held.bind(("127.0.0.1", 29803))  # the bus of port 19803
        held.listen()
        bases = {free_port_run(2, offset=10000) for _ in range(100)}
    # The walk visits every base in turn over the picks (7 bases, an odd number, in steps
    # of the run's length): never the two whose run or bus holds the port.
    assert len(bases) >= 2 and bases <= {19800, 19801, 19804, 19805, 19806}
    with socket.socket() as held:
        held.bind(("127.0.0.1", 19802))
        held.listen()
        with pytest.raises(RuntimeError, match="no free run of 7 ports"):
            free_port_run(7)


def test_runs_picked_before_any_binds_never_overlap() -> None:
    # A chaos stack picks its Redis run, Kafka and proxy ports, MariaDB's, then starts them.
    picked: list[int] = []
    for count, offset in [(6, 10000), (1, 100), (1, 0), (1, 0), (1, 0), (3, 10000)]:
        base = free_port_run(count, offset=offset)
        picked += [*range(base, base + count)] + (
            [*range(base + offset, base + offset + count)] if offset else []
        )
    assert len(set(picked)) == len(picked), picked
    singles = [free_port_run(1) for _ in range(100)]
    assert len(set(singles)) == len(singles)  # a random pick of 700 would repeat by now
