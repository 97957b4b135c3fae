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

    @classmethod
    def load(cls, name: str) -> LuaScript:
        source = files(__package__).joinpath(f"{name}.lua").read_text(encoding="utf-8")
        return cls(name, source, hashlib.sha1(source.encode()).hexdigest())


ISSUE = LuaScript.load("issue")
PROVISION = LuaScript.load("provision")
