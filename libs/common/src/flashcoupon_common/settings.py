"""Settings read from the environment, validated once at start-up.

Each service's settings are a frozen dataclass, and each default is written once, in that
dataclass: `read_env` walks its fields, takes each variable's name from the field's metadata
(`setting(..., env="FLASHCOUPON_REDIS_NODES")`) or from the prefix plus the upper-cased field
name, converts the text by the field's type and uses the dataclass default when the variable is
unset or empty. A missing required or malformed value raises SettingsError naming the variable.
Rules about one value (`check=positive`) sit on its field, where the reader can name the
variable whatever the prefix; rules across fields sit in the dataclass's `__post_init__`.

Connection settings (Redis nodes, Kafka bootstrap, MySQL URL — the password included) have no
defaults in production: a Deployment that forgot one must not quietly dial 127.0.0.1 and fail at
first use. Only with FLASHCOUPON_ENV=local (set by the Makefile, the demo and the tests) do
they default to the local stack of scripts/stack.sh (`setting(local=...)`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self, TypeVar

T = TypeVar("T")
N = TypeVar("N", int, float)

Check = Callable[[Any], str | None]  # a complaint ("must be > 0, got 0"), or None when fine
Parse = Callable[[str, str], Any]  # (variable, text) -> value; raises SettingsError


class SettingsError(ValueError):
    """A variable is missing or malformed; the message names it."""


def setting(
    default: Any = dataclasses.MISSING,
    *,
    default_factory: Callable[[], Any] | Any = dataclasses.MISSING,
    env: str | None = None,
    choices: tuple[str, ...] | None = None,
    check: Check | None = None,
    parse: Parse | None = None,
    local: str | None = None,
) -> Any:
    """A settings field: `env` names its variable (default: prefix + FIELD_NAME), `choices`
    limits a string, `check` judges the converted value, `parse` replaces conversion by type,
    `local` is the local stack's value of a connection setting that is otherwise required."""
    meta = {"env": env, "choices": choices, "check": check, "parse": parse, "local": local}
    return dataclasses.field(
        default=default,
        default_factory=default_factory,
        metadata={k: v for k, v in meta.items() if v is not None},
    )


def read_env(cls: type[T], env: Mapping[str, str] | None = None, prefix: str = "") -> T:
    """Build settings dataclass `cls` from `env` (default os.environ); nested settings
    dataclasses are read with the same prefix."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    for f, kind in _fields(typing.cast(type, cls)):
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            values[f.name] = read_env(kind, env, prefix)
            continue
        name = f.metadata.get("env") or prefix + f.name.upper()
        raw = env.get(name) or None  # empty is unset, as a Helm value left blank renders
        if raw is None:
            if "local" in f.metadata:
                raw = _connection(env, name, f.metadata["local"])
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise SettingsError(f"{name} is required but not set")
            else:
                continue  # the dataclass default
        values[f.name] = _value(name, raw, kind, f.metadata)
    return cls(**values)


def env_variables(cls: type, prefix: str = "") -> tuple[str, ...]:
    """Every variable `read_env(cls, env, prefix)` reads, in field order (docs, tests)."""
    names: list[str] = []
    for f, kind in _fields(cls):
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            names.extend(env_variables(kind, prefix))
        else:
            names.append(f.metadata.get("env") or prefix + f.name.upper())
    return tuple(names)


@functools.cache
def _fields(cls: type) -> tuple[tuple[dataclasses.Field[Any], Any], ...]:
    # Resolved once per class: with `from __future__ import annotations` types are strings.
    hints = typing.get_type_hints(cls)
    return tuple((f, hints[f.name]) for f in dataclasses.fields(cls) if f.init)


def _value(name: str, raw: str, kind: Any, meta: Mapping[str, Any]) -> Any:
    value = meta["parse"](name, raw) if "parse" in meta else _convert(name, raw, kind)
    if "choices" in meta and value not in meta["choices"]:
        raise SettingsError(f"{name} must be one of {', '.join(meta['choices'])}; got {value!r}")
    complaint = meta["check"](value) if "check" in meta else None
    if complaint:
        raise SettingsError(f"{name} {complaint}")
    return value


def _convert(name: str, raw: str, kind: Any) -> Any:
    """Text to the field's type: str, int, float, bool (true/false), tuple[str, ...] from a
    comma list, or an optional one of these."""
    if isinstance(kind, types.UnionType):  # `str | None`: a set variable is never None
        (kind,) = (a for a in typing.get_args(kind) if a is not type(None))
    if kind is str:
        return raw
    if kind is int:
        return _number(name, raw, int, "an integer")
    if kind is float:
        return _number(name, raw, float, "a number")
    if kind is bool:
        if raw not in ("true", "false"):
            raise SettingsError(f"{name} must be one of true, false; got {raw!r}")
        return raw == "true"
    if typing.get_origin(kind) is tuple and typing.get_args(kind) == (str, ...):
        return tuple(part.strip() for part in raw.split(",") if part.strip())
    raise TypeError(f"{name}: no conversion for {kind!r}; give the field a parse function")


def _number(name: str, raw: str, kind: type[N], what: str) -> N:
    try:
        return kind(raw)
    except ValueError:
        raise SettingsError(f"{name} must be {what}, got {raw!r}") from None


EXIT_BAD_SETTINGS = 2


def settings_or_exit(prog: str, read: Callable[[], T]) -> T:
    """Start-up: `read()` the settings, or print one line naming the variable to stderr and
    exit 2 — no traceback, which would bury the one line an operator needs."""
    try:
        return read()
    except SettingsError as exc:
        sys.stderr.write(f"{prog}: {exc}\n")
        raise SystemExit(EXIT_BAD_SETTINGS) from None


class FromEnv:
    """Mixin for a settings dataclass: `from_env` reads it with `read_env` and its `prefix`."""

    prefix: ClassVar[str] = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Self:
        return read_env(cls, env, cls.prefix)


# Checks for `setting(check=...)`: each returns what is wrong, or None.


def positive(value: float) -> str | None:
    return None if value > 0 else f"must be > 0, got {value}"


def non_negative(value: float) -> str | None:
    return None if value >= 0 else f"must be >= 0, got {value}"


def between(low: float, high: float) -> Check:
    def check(value: float) -> str | None:
        # `low <= value <= high` is False for NaN, so NaN is refused too.
        return None if low <= value <= high else f"must be {low}..{high}, got {value}"

    return check


tcp_port = between(1, 65535)


def env_float(env: Mapping[str, str], name: str, default: float) -> float:
    """One number outside a settings class (the operator's refresh period)."""
    raw = env.get(name)
    return _number(name, raw, float, "a number") if raw else default


ENVIRONMENT = "FLASHCOUPON_ENV"
LOCAL = "local"

# Defaults match scripts/stack.sh, used only when FLASHCOUPON_ENV=local.
LOCAL_REDIS_NODES = ",".join(f"127.0.0.1:{p}" for p in range(17000, 17006))
LOCAL_KAFKA_BOOTSTRAP = "127.0.0.1:19092"
LOCAL_MYSQL_URL = "mysql+asyncmy://flashcoupon:flashcoupon@127.0.0.1:13306/flashcoupon"


def is_local(env: Mapping[str, str]) -> bool:
    """FLASHCOUPON_ENV=local: connection settings may default to the local stack."""
    value = env.get(ENVIRONMENT) or "production"
    if value not in ("local", "production"):
        raise SettingsError(f"{ENVIRONMENT} must be one of local, production; got {value!r}")
    return value == LOCAL


def _connection(env: Mapping[str, str], name: str, local_default: str) -> str:
    """An unset connection setting: the local stack's, or a SettingsError in production."""
    if is_local(env):
        return local_default
    raise SettingsError(
        f"{name} is required but not set (or set {ENVIRONMENT}=local for the local stack)"
    )


def _redis_nodes(name: str, raw: str) -> tuple[tuple[str, int], ...]:
    nodes = []
    for part in raw.split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit():
            raise SettingsError(f"{name}: {part!r} is not host:port")
        nodes.append((host, int(port)))
    return tuple(nodes)


def _mysql_url(url: str) -> str | None:
    # The complaint never repeats the URL: it carries the password.
    return None if url.startswith("mysql+asyncmy://") else "must start with mysql+asyncmy://"


@dataclass(frozen=True)
class RedisSettings(FromEnv):
    """Startup nodes of the Redis Cluster, as host:port pairs."""

    nodes: tuple[tuple[str, int], ...] = dataclasses.field(
        metadata={
            "env": "FLASHCOUPON_REDIS_NODES",
            "parse": _redis_nodes,
            "local": LOCAL_REDIS_NODES,
        }
    )


@dataclass(frozen=True)
class KafkaSettings(FromEnv):
    bootstrap: str = dataclasses.field(
        metadata={"env": "FLASHCOUPON_KAFKA_BOOTSTRAP", "local": LOCAL_KAFKA_BOOTSTRAP}
    )


@dataclass(frozen=True)
class MysqlSettings(FromEnv):
    """SQLAlchemy URL, e.g. mysql+asyncmy://user:password@host:3306/database."""

    url: str = dataclasses.field(
        metadata={"env": "FLASHCOUPON_MYSQL_URL", "check": _mysql_url, "local": LOCAL_MYSQL_URL}
    )
