"""Building the Redis Cluster client every service uses."""

from __future__ import annotations

from redis.asyncio.cluster import ClusterNode, RedisCluster

from flashcoupon_common.settings import RedisSettings


def create_redis_cluster(settings: RedisSettings, **options: object) -> RedisCluster:
    """A cluster client; it connects lazily on first command (or `await client.initialize()`)."""
    nodes = [ClusterNode(host, port) for host, port in settings.nodes]
    options.setdefault("decode_responses", False)
    return RedisCluster(startup_nodes=nodes, **options)  # type: ignore[arg-type]
