from __future__ import annotations

import pytest
from flashcoupon_common.settings import (
    KafkaSettings,
    MysqlSettings,
    RedisSettings,
    SettingsError,
    env_choice,
    env_float,
    env_int,
    env_str,
)

from tests.support.env import LOCAL


def test_numbers_parse_default_and_name_the_variable_when_wrong() -> None:
    assert env_int({"N": "3"}, "N") == 3
    assert env_int({}, "N", 7) == 7
    assert env_float({"F": "2.5"}, "F") == 2.5
    with pytest.raises(SettingsError, match="N must be an integer, got 'x'"):
        env_int({"N": "x"}, "N")
    with pytest.raises(SettingsError, match="F must be a number"):
        env_float({"F": "fast"}, "F")
    with pytest.raises(SettingsError, match="N is required"):
        env_int({"N": ""}, "N")


def test_strings_and_choices() -> None:
    assert env_str({}, "S", "d") == "d"
    with pytest.raises(SettingsError, match="S is required"):
        env_str({}, "S")
    assert env_choice({"C": "replica"}, "C", ("none", "replica"), "none") == "replica"
    with pytest.raises(SettingsError, match="C must be one of none, replica; got 'all'"):
        env_choice({"C": "all"}, "C", ("none", "replica"), "none")


def test_redis_nodes_and_mysql_url_are_validated() -> None:
    env = {"FLASHCOUPON_REDIS_NODES": "10.0.0.1:7000, redis-b:7001"}
    assert RedisSettings.from_env(env).nodes == (("10.0.0.1", 7000), ("redis-b", 7001))
    with pytest.raises(SettingsError, match="'redis-b' is not host:port"):
        RedisSettings.from_env({**LOCAL, "FLASHCOUPON_REDIS_NODES": "redis-b"})
    with pytest.raises(SettingsError, match="must start with mysql\\+asyncmy://"):
        MysqlSettings.from_env({**LOCAL, "FLASHCOUPON_MYSQL_URL": "postgres://x"})
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
