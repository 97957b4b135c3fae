"""`scripts/stack.sh status` tells the truth about a Redis Cluster that lost a master."""

from __future__ import annotations

import time

from tests.support.private_stack import private_redis


def test_status_reports_a_killed_master_then_the_failover() -> None:
    redis, ports = private_redis()
    redis.start()
    try:
        healthy = redis.status()
        # Only the Redis part runs here, so the whole-stack verdict is unhealthy; the Redis
        # lines are what this test reads.
        assert all(f"127.0.0.1:{p}" in healthy.stdout for p in ports)
        assert "DOWN" not in healthy.stdout.split("Kafka")[0]
        master = next(p for p in ports if f"127.0.0.1:{p}  master" in healthy.stdout)

        redis.kill(master)
        report = redis.status()
        assert report.returncode == 1
        assert f"127.0.0.1:{master}  DOWN" in report.stdout

        # The master's replica is promoted after cluster-node-timeout (3 s); status then
        # shows three masters serving slots again and one failed node.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            report = redis.status()
            if "masters serving slots: 3; failed nodes seen: 1" in report.stdout:
                break
            time.sleep(1)
        assert "masters serving slots: 3; failed nodes seen: 1" in report.stdout, report.stdout
        assert report.returncode == 1  # still a node down: not healthy

        redis.start()  # `up` restarts the dead node; it rejoins as a replica
        report = redis.status()
        assert f"127.0.0.1:{master}  slave" in report.stdout, report.stdout
    finally:
        redis.stop()
