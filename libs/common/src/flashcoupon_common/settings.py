"""Settings read from the environment, validated once at start-up.

Every service builds one settings object from these pieces. A missing or malformed variable
fails start-up with a message that names the variable, rather than failing on first use.

Connection settings (Redis nodes, Kafka bootstrap, MySQL URL — the password included) have no
defaults in production: a Deployment that forgot one must not quietly dial 127.0.0.1 and fail at
first use. Only with FLASHCOUPON_ENV=local (set by the Makefile, the demo and the tests) do
they default to the local stack of scripts/stack.sh.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

N = TypeVar("N", int, float)


class SettingsError(ValueError):
    """A variable is missing or malformed; the message names it."""


def env_str(env: Mapping[str, str], name: str, default: str | None = None) -> str:
    value = env.get(name, default)
    if value is None or value == "":
        raise SettingsError(f"{name} is required but not set")
    return value


def _env_number(
    env: Mapping[str, str], name: str, default: N | None, kind: type[N], what: str
) -> N:
    raw = env.get(name)
    if raw is None or raw == "":
        if default is None:
            raise SettingsError(f"{name} is required but not set")
        return default
    try:
        return kind(raw)
    except ValueError:
        raise SettingsError(f"{name} must be {what}, got {raw!r}") from None


def env_int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    return _env_number(env, name, default, int, "an integer")


def env_float(env: Mapping[str, str], name: str, default: float | None = None) -> float:
    return _env_number(env, name, default, float, "a number")


def env_choice(env: Mapping[str, str], name: str, choices: tuple[str, ...], default: str) -> str:
    value = env.get(name) or default
    if value not in choices:
        raise SettingsError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
    return value


ENVIRONMENT = "FLASHCOUPON_ENV"
LOCAL = "local"

# Defaults match scripts/stack.sh, used only when FLASHCOUPON_ENV=local.
LOCAL_REDIS_NODES = ",".join(f"127.0.0.1:{p}" for p in range(17000, 17006))
LOCAL_KAFKA_BOOTSTRAP = "127.0.0.1:19092"
LOCAL_MYSQL_URL = "mysql+asyncmy://flashcoupon:flashcoupon@127.0.0.1:13306/flashcoupon"


def is_local(env: Mapping[str, str]) -> bool:
    """FLASHCOUPON_ENV=local: connection settings may default to the local stack."""
    return env_choice(env, ENVIRONMENT, ("local", "production"), "production") == LOCAL


def env_connection(env: Mapping[str, str], name: str, local_default: str) -> str:
    """A connection setting: required, unless FLASHCOUPON_ENV=local supplies the local stack's."""
    value = env.get(name)
    if value:
        return value
    if is_local(env):
        return local_default
    raise SettingsError(
        f"{name} is required but not set (or set {ENVIRONMENT}=local for the local stack)"
    )


@dataclass(frozen=True)
class RedisSettings:
    """Startup nodes of the Redis Cluster, as host:port pairs."""

    nodes: tuple[tuple[str, int], ...]

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RedisSettings:
        env = os.environ if env is None else env
        raw = env_connection(env, "FLASHCOUPON_REDIS_NODES", LOCAL_REDIS_NODES)
        nodes = []
        for part in raw.split(","):
            host, sep, port = part.strip().rpartition(":")
            if not sep or not host or not port.isdigit():
                raise SettingsError(f"FLASHCOUPON_REDIS_NODES: {part!r} is not host:port")
            nodes.append((host, int(port)))
        return cls(nodes=tuple(nodes))


@dataclass(frozen=True)
class KafkaSettings:
    bootstrap: str

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> KafkaSettings:
        env = os.environ if env is None else env
        return cls(
            bootstrap=env_connection(env, "FLASHCOUPON_KAFKA_BOOTSTRAP", LOCAL_KAFKA_BOOTSTRAP)
        )


@dataclass(frozen=True)
class MysqlSettings:
    """SQLAlchemy URL, e.g. mysql+asyncmy://user:password@host:3306/database."""

    url: str

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> MysqlSettings:
        env = os.environ if env is None else env
        url = env_connection(env, "FLASHCOUPON_MYSQL_URL", LOCAL_MYSQL_URL)
        if not url.startswith("mysql+asyncmy://"):
            raise SettingsError("FLASHCOUPON_MYSQL_URL must start with mysql+asyncmy://")
        return cls(url=url)
