"""What each Redis server spent its time on during a drop: INFO commandstats before and after.

`phase CPU` says how much of the box the cluster's servers took (a fifth of the issuing phase);
this says on which commands. Each server's counters are read at the go and after the last
answer, and the difference is kept per command: calls, µs, µs per call — the script runs of
issue.lua and of the limiter (EVALSHA) on the masters, the outbox's reads and deletes by the
relay (XREADGROUP, XDEL, XACK), what the replicas apply (EXEC of a script's effects, XCLAIM for
each entry a relay read).

Redis counts a command a script runs twice: in its own row and inside the script call's time.
So a server's rows do not add up to its CPU; they say where it went.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

logger = logging.getLogger(__name__)

Commands = dict[str, tuple[int, int]]  # command -> (calls, µs) so far
ServerStats = tuple[str, Commands]  # (role, commands)

_PREFIX = "cmdstat_"


def parse_commandstats(info: Mapping[str, Any]) -> Commands:
    """redis-py's parsed INFO commandstats of one server → {command: (calls, µs)}."""
    out = {}
    for key, stats in info.items():
        if key.startswith(_PREFIX) and isinstance(stats, Mapping):
            out[key[len(_PREFIX) :]] = (int(stats.get("calls", 0)), int(stats.get("usec", 0)))
    return out


async def read_commandstats(redis: Any) -> dict[str, ServerStats]:
    """Every server's role and command counters, by `host:port`; {} when they cannot be read
    (INFO not allowed, a server away): the report then leaves the line out."""
    try:
        stats = await redis.info("commandstats", target_nodes=redis.ALL_NODES)
        roles = await redis.info("replication", target_nodes=redis.ALL_NODES)
    except Exception as exc:  # noqa: BLE001 - a diagnostic: the drop goes on without it
        logger.warning("could not read Redis INFO commandstats: %r", exc)
        return {}
    return {
        node: (
            "replica" if roles.get(node, {}).get("role") == "slave" else "master",
            parse_commandstats(info),
        )
        for node, info in stats.items()
    }


def command_delta(
    before: Mapping[str, ServerStats], after: Mapping[str, ServerStats], *, top: int = 5
) -> dict[str, dict[str, Any]] | None:
    """Per server (busiest first): its role and its `top` commands by µs between the two
    readings, each with calls, µs and µs per call. None: not read."""
    if not before or not after:
        return None
    servers = []
    for node, (role, now) in after.items():
        then = before.get(node, (role, {}))[1]
        rows = []
        for command, (calls, usec) in now.items():
            c0, u0 = then.get(command, (0, 0))
            if calls > c0:
                rows.append((command, calls - c0, usec - u0))
        rows.sort(key=lambda r: -r[2])
        servers.append((sum(r[2] for r in rows), node, role, rows[:top]))
    servers.sort(key=lambda s: -s[0])
    return {
        node: {
            "role": role,
            "commands": {
                command: {
                    "calls": calls,
                    "usec": usec,
                    "usec_per_call": round(usec / calls, 2),
                }
                for command, calls, usec in rows
            },
        }
        for _, node, role, rows in servers
        if rows
    }
