"""The generic settings reader: every default written once, every error naming its variable.

The tables below are the variables and defaults the services had before the reader replaced
their hand-written `from_env`s; docs/ and the Helm chart use these names.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import pytest
from flashcoupon_common.httpserver import ServerTimeouts
from flashcoupon_common.settings import (
    FromEnv,
    KafkaSettings,
    MysqlSettings,
    RedisSettings,
    SettingsError,
    between,
    env_variables,
    positive,
    read_env,
    setting,
)
from flashcoupon_gateway.settings import GatewaySettings
from flashcoupon_issuer.settings import IssuerSettings
from flashcoupon_operator.__main__ import OperatorSettings
from flashcoupon_persister.settings import PersisterSettings
from flashcoupon_relay.settings import RelaySettings
from flashcoupon_wallet.settings import WalletSettings

from tests.support.env import LOCAL

SECRET = "0123456789abcdef0123456789abcdef"
LOCAL_NODES = tuple(("127.0.0.1", p) for p in range(17000, 17006))
LOCAL_MYSQL = "mysql+asyncmy://flashcoupon:flashcoupon@127.0.0.1:13306/flashcoupon"

DEFAULTS: dict[type, dict[str, Any]] = {
    GatewaySettings: {
        "redis": {"nodes": LOCAL_NODES},
        "auth": {
            "secret": SECRET,
            "jwks_url": None,
            "audience": "flashcoupon",
            "leeway_seconds": 5.0,
            "jwks_ttl_seconds": 300.0,
        },
        "issuer_urls": ("http://127.0.0.1:8081",),
        "wallet_url": "http://127.0.0.1:8082",
        "ticket_secret": f"t:{SECRET}",
        "limits": {
            "ip_per_second": 100.0,
            "ip_burst": 200,
            "user_per_second": 10.0,
            "user_burst": 20,
            "event_shards": 8,
            "trusted_proxies": 0,
        },
        "host": "127.0.0.1",
        "port": 8080,
        "upstream_timeout_seconds": 2.0,
        "upstream_connections": 200,
        "issue_batch_max": 32,
        "issuer_routing": "batch",
        "max_in_flight": 2000,
        "max_body_bytes": 4096,
        "breaker_failures": 5,
        "breaker_open_seconds": 5.0,
        "spec_cache_seconds": 1.0,
        "ticket_ttl_seconds": 1800,
        "sse_interval_seconds": 0.5,
        "timeouts": {"header_timeout_seconds": 10.0, "body_timeout_seconds": 10.0},
    },
    IssuerSettings: {
        "redis": {"nodes": LOCAL_NODES},
        "host": "127.0.0.1",
        "port": 8081,
        "durability": "none",
        "wait_timeout_ms": 200,
        "unconfirmed": "fail",
        "sold_out_ttl_s": 2.0,
        "batching": True,
        "max_batch": 32,
        "max_inflight": 4,
        "decide_allowance": True,
        "outbox_entry": "one-field",
        "retry_deadline_s": 15.0,
        "deadline_margin_ms": 300,
        "redis_max_connections": 512,
        "timeouts": {"header_timeout_seconds": 10.0, "body_timeout_seconds": 10.0},
    },
    RelaySettings: {
        "redis": {"nodes": LOCAL_NODES},
        "kafka": {"bootstrap": "127.0.0.1:19092"},
        "topic": "coupon-issued",
        "dlq_topic": "coupon-issued-dlq",
        "batch_size": 1000,
        "block_ms": 1000,
        "linger_ms": 5,
        "gather_ms": 50,
        "claim_idle_ms": 30000,
        "claim_interval_ms": 5000,
        "registry_refresh_ms": 3000,
        "metrics_interval_ms": 5000,
        "delivery_timeout_ms": 15000,
        "backoff_base_ms": 100,
        "backoff_max_ms": 5000,
        "shutdown_grace_ms": 10000,
        "forget_consumer_ms": 3600000,
        "events": (),
        "host": "127.0.0.1",
        "port": 8084,
        "log_level": "INFO",
        "durability": "none",
        "wait_timeout_ms": 200,
    },
    PersisterSettings: {
        "kafka": {"bootstrap": "127.0.0.1:19092"},
        "mysql": {"url": LOCAL_MYSQL},
        "group_id": "persister",
        "topic": "coupon-issued",
        "dlq_topic": "coupon-issued-dlq",
        "max_batch": 4000,
        "max_wait_ms": 100,
        "write_concurrency": 4,
        "retry_backoff_base_s": 0.2,
        "retry_backoff_cap_s": 5.0,
        "db_write_timeout_s": 5.0,
        "db_pool_size": 6,
        "host": "127.0.0.1",
        "port": 8083,
    },
    WalletSettings: {
        "mysql": {"url": LOCAL_MYSQL},
        "kafka": {"bootstrap": "127.0.0.1:19092"},
        "host": "127.0.0.1",
        "port": 8082,
        "redeemed_topic": "coupon-redeemed",
        "db_pool_size": 10,
        "max_body_bytes": 4096,
        "publish_batch": 500,
        "publish_poll_seconds": 1.0,
        "publish_drain_seconds": 5.0,
        "log_level": "INFO",
    },
    OperatorSettings: {
        "redis": {"nodes": LOCAL_NODES},
        "mysql": {"url": LOCAL_MYSQL},
        "namespace": None,
        "liveness": "http://0.0.0.0:8085/healthz",
        "metrics_port": 8086,
    },
}

REDIS, KAFKA, MYSQL = "REDIS_NODES", "KAFKA_BOOTSTRAP", "MYSQL_URL"
VARIABLES: dict[type, tuple[str, ...]] = {
    # Service-prefixed suffixes, and the shared connection variables (FLASHCOUPON_ + name).
    GatewaySettings: (
        REDIS, "JWT_SECRET", "JWKS_URL", "JWT_AUDIENCE", "JWT_LEEWAY_SECONDS", "JWKS_TTL_SECONDS",
        "ISSUER_URLS", "WALLET_URL", "TICKET_SECRET", "IP_PER_SECOND", "IP_BURST",
        "USER_PER_SECOND", "USER_BURST", "EVENT_SHARDS", "TRUSTED_PROXIES", "HOST", "PORT",
        "UPSTREAM_TIMEOUT_SECONDS", "UPSTREAM_CONNECTIONS", "ISSUE_BATCH_MAX", "ISSUER_ROUTING",
        "MAX_IN_FLIGHT", "MAX_BODY_BYTES",
        "BREAKER_FAILURES", "BREAKER_OPEN_SECONDS", "SPEC_CACHE_SECONDS", "TICKET_TTL_SECONDS",
        "SSE_INTERVAL_SECONDS", "HEADER_TIMEOUT_SECONDS", "BODY_TIMEOUT_SECONDS",
    ),
    IssuerSettings: (
        REDIS, "HOST", "PORT", "DURABILITY", "WAIT_TIMEOUT_MS", "UNCONFIRMED", "SOLD_OUT_TTL_S",
        "BATCHING", "MAX_BATCH", "MAX_INFLIGHT", "DECIDE_ALLOWANCE", "OUTBOX_ENTRY",
        "RETRY_DEADLINE_S", "DEADLINE_MARGIN_MS",
        "REDIS_MAX_CONNECTIONS", "HEADER_TIMEOUT_SECONDS", "BODY_TIMEOUT_SECONDS",
    ),
    RelaySettings: (
        REDIS, KAFKA, "CONSUMER", "TOPIC", "DLQ_TOPIC", "BATCH_SIZE", "BLOCK_MS", "LINGER_MS",
        "GATHER_MS", "CLAIM_IDLE_MS", "CLAIM_INTERVAL_MS", "REGISTRY_REFRESH_MS",
        "METRICS_INTERVAL_MS",
        "DELIVERY_TIMEOUT_MS", "BACKOFF_BASE_MS", "BACKOFF_MAX_MS", "SHUTDOWN_GRACE_MS",
        "FORGET_CONSUMER_MS", "EVENTS", "HOST", "PORT", "LOG_LEVEL", "DURABILITY",
        "WAIT_TIMEOUT_MS",
    ),
    PersisterSettings: (
        KAFKA, MYSQL, "GROUP_ID", "TOPIC", "DLQ_TOPIC", "MAX_BATCH", "MAX_WAIT_MS",
        "WRITE_CONCURRENCY", "RETRY_BACKOFF_BASE_S", "RETRY_BACKOFF_CAP_S", "DB_WRITE_TIMEOUT_S",
        "DB_POOL_SIZE", "HOST", "PORT",
    ),
    WalletSettings: (
        MYSQL, KAFKA, "HOST", "PORT", "REDEEMED_TOPIC", "DB_POOL_SIZE", "MAX_BODY_BYTES",
        "PUBLISH_BATCH", "PUBLISH_POLL_SECONDS", "PUBLISH_DRAIN_SECONDS", "LOG_LEVEL",
    ),
    OperatorSettings: (REDIS, MYSQL, "NAMESPACE", "LIVENESS", "METRICS_PORT"),
}  # fmt: skip


@pytest.mark.parametrize("cls", list(DEFAULTS), ids=lambda c: c.__name__)
def test_an_empty_local_env_gives_the_defaults_of_before(cls: type[FromEnv]) -> None:
    settings = cls.from_env({**LOCAL, "FLASHCOUPON_GATEWAY_JWT_SECRET": SECRET})
    got = dataclasses.asdict(settings)  # type: ignore[call-overload]
    got.pop("consumer", None)  # hostname-pid, checked below
    assert got == DEFAULTS[cls]


@pytest.mark.parametrize("cls", list(VARIABLES), ids=lambda c: c.__name__)
def test_every_variable_keeps_its_name(cls: type[FromEnv]) -> None:
    shared = (REDIS, KAFKA, MYSQL)
    expected = tuple(f"FLASHCOUPON_{v}" if v in shared else cls.prefix + v for v in VARIABLES[cls])
    assert env_variables(cls, cls.prefix) == expected


def test_server_timeouts_keep_their_names_and_defaults() -> None:
    assert env_variables(ServerTimeouts, "P_") == (
        "P_HEADER_TIMEOUT_SECONDS",
        "P_BODY_TIMEOUT_SECONDS",
    )
    assert ServerTimeouts.from_env("P_", {}) == ServerTimeouts(10.0, 10.0)


def test_relay_consumer_defaults_to_hostname_pid() -> None:
    host, _, pid = RelaySettings.from_env(LOCAL).consumer.rpartition("-")
    assert host and pid.isdigit()


@dataclass(frozen=True)
class Sample(FromEnv):
    """One field of each kind the reader converts."""

    prefix = "S_"

    name: str
    count: int = setting(3, check=positive)
    ratio: float = setting(0.5, check=between(0, 1))
    on: bool = True
    mode: str = setting("a", choices=("a", "b"))
    tags: tuple[str, ...] = ()
    url: str | None = setting(None, env="OTHER_URL")

    def __post_init__(self) -> None:
        if self.mode == "b" and not self.tags:
            raise SettingsError("S_TAGS must be set when S_MODE=b")


def test_each_type_is_converted_and_unset_or_empty_means_the_default() -> None:
    s = Sample.from_env(
        {
            "S_NAME": "n",
            "S_COUNT": "7",
            "S_RATIO": "0.25",
            "S_ON": "false",
            "S_MODE": "b",
            "S_TAGS": " x, y,,",
            "OTHER_URL": "http://u",
        }
    )
    assert s == Sample("n", 7, 0.25, False, "b", ("x", "y"), "http://u")
    assert Sample.from_env({"S_NAME": "n", "S_COUNT": ""}) == Sample("n")


NAMED = {"S_NAME": "n"}


@pytest.mark.parametrize(
    ("env", "message"),
    [
        # required and unset (or empty)
        ({}, "S_NAME is required but not set"),
        ({"S_NAME": ""}, "S_NAME is required but not set"),
        # malformed for the type
        ({**NAMED, "S_COUNT": "x"}, "S_COUNT must be an integer, got 'x'"),
        ({**NAMED, "S_RATIO": "fast"}, "S_RATIO must be a number, got 'fast'"),
        ({**NAMED, "S_ON": "yes"}, "S_ON must be one of true, false; got 'yes'"),
        # outside the choices, or refused by the field's check
        ({**NAMED, "S_MODE": "c"}, "S_MODE must be one of a, b; got 'c'"),
        ({**NAMED, "S_COUNT": "0"}, "S_COUNT must be > 0, got 0"),
        ({**NAMED, "S_RATIO": "nan"}, "S_RATIO must be 0..1, got nan"),
        # a rule across fields (__post_init__)
        ({**NAMED, "S_MODE": "b"}, "S_TAGS must be set when S_MODE=b"),
    ],
)
def test_each_error_names_the_variable(env: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError) as err:
        read_env(Sample, env, "S_")
    assert str(err.value) == message


def test_redis_nodes_and_mysql_url_are_validated() -> None:
    env = {"FLASHCOUPON_REDIS_NODES": "10.0.0.1:7000, redis-b:7001"}
    assert RedisSettings.from_env(env).nodes == (("10.0.0.1", 7000), ("redis-b", 7001))
    with pytest.raises(SettingsError, match="'redis-b' is not host:port"):
        RedisSettings.from_env({**LOCAL, "FLASHCOUPON_REDIS_NODES": "redis-b"})
    with pytest.raises(SettingsError) as err:
        MysqlSettings.from_env({**LOCAL, "FLASHCOUPON_MYSQL_URL": "postgres://u:pw@h/d"})
    # The message never repeats the URL, which carries the password.
    assert str(err.value) == "FLASHCOUPON_MYSQL_URL must start with mysql+asyncmy://"
    assert RedisSettings.from_env(LOCAL).nodes[0] == ("127.0.0.1", 17000)  # the local stack


@pytest.mark.parametrize(
    ("settings", "variable"),
    [
        (RedisSettings, "FLASHCOUPON_REDIS_NODES"),
        (KafkaSettings, "FLASHCOUPON_KAFKA_BOOTSTRAP"),
        (MysqlSettings, "FLASHCOUPON_MYSQL_URL"),
    ],
)
def test_connection_settings_are_required_outside_the_local_stack(
    settings: type[RedisSettings | KafkaSettings | MysqlSettings], variable: str
) -> None:
    # A Deployment that forgot a variable stops at start-up, naming it; it never dials the
    # local stack's 127.0.0.1 defaults.
    for production in ({}, {"FLASHCOUPON_ENV": "production"}):
        with pytest.raises(SettingsError, match=f"{variable} is required"):
            settings.from_env(production)
    settings.from_env(LOCAL)  # the local stack's defaults
    with pytest.raises(SettingsError, match="FLASHCOUPON_ENV must be one of local, production"):
        settings.from_env({"FLASHCOUPON_ENV": "dev"})
