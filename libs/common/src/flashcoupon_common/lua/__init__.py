"""The Lua scripts the services run inside Redis, loaded once from package data.

`sha` is computed locally (it is what SCRIPT LOAD would answer), so callers can EVALSHA
without a round trip and fall back to SCRIPT LOAD on NOSCRIPT (a restarted or failed-over node
has an empty script cache).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from importlib.resources import files


@dataclass(frozen=True)
class LuaScript:
    name: str
    source: str = field(repr=False)
    sha: str
    # > 0: the script takes any number of calls in one run, `stride` ARGV values each, and
    # answers a list with one reply per call (issue.lua). The batcher then sends the calls
    # queued together for the same keys as one run.
    stride: int = 0

    @classmethod
    def from_source(cls, name: str, source: str, *, stride: int = 0) -> LuaScript:
        return cls(name, source, hashlib.sha1(source.encode()).hexdigest(), stride)

    @classmethod
    def load(cls, name: str, *, stride: int = 0) -> LuaScript:
        """This package's `<name>.lua`."""
        source = files(__package__).joinpath(f"{name}.lua").read_text(encoding="utf-8")
        return cls.from_source(name, source, stride=stride)


ISSUE = LuaScript.load("issue", stride=5)
# issue.lua writing each outbox entry as a field per value, as it did before the one-field
# entry: for a rollout while relays that cannot read that shape still run (the issuer's
# OUTBOX_ENTRY setting, docs/relay.md).
ISSUE_FIELD_ENTRIES = LuaScript.from_source(
    "issue",
    ISSUE.source.replace("local OUTBOX_ENTRY = 'one-field'", "local OUTBOX_ENTRY = 'fields'", 1),
    stride=ISSUE.stride,
)
assert ISSUE_FIELD_ENTRIES.sha != ISSUE.sha, "issue.lua's OUTBOX_ENTRY line was not found"
PROVISION = LuaScript.load("provision")
