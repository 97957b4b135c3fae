"""Measure the Redis memory of an event's runtime state per 1 M coupons / participants.

    uv run python -m flashcoupon_loadtest.memory_probe [--records 200000]

Provisions a throw-away event on the local cluster, issues `--records` coupons to distinct
users through the real issue.lua (pipelined with the ScriptBatcher), reads `MEMORY USAGE <key>
SAMPLES 0` (exact: every element counted) of each of the event's keys and the node's
`used_memory` delta, extrapolates to 1 M, deletes the event and prints/writes the numbers
(loadtest/results/memory-probe.json). It also measures the bitmap alternative for integer user
ids (docs/redis-layout.md). Numbers feed docs/redis-layout.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
import uuid
from pathlib import Path
from typing import Any

from flashcoupon_common import event_state, keys
from flashcoupon_common.lua import ISSUE
from flashcoupon_common.redis_batch import ScriptBatcher
from flashcoupon_common.redis_cluster import create_redis_cluster
from flashcoupon_common.settings import RedisSettings

from flashcoupon_loadtest.benchkit import bench_spec as _spec

RESULTS = Path(__file__).resolve().parents[2] / "results"


async def _usage(node_client: Any, key: str) -> int:
    return int(await node_client.execute_command("MEMORY", "USAGE", key, "SAMPLES", "0") or 0)


async def probe(records: int, user_len: int) -> dict[str, Any]:
    redis = create_redis_cluster(RedisSettings.from_env())
    await redis.initialize()
    eid = f"memprobe-{uuid.uuid4().hex[:8]}"
    await event_state.provision(redis, _spec(eid, records))
    node = redis.nodes_manager.get_node_from_slot(redis.keyslot(keys.config_key(eid)))
    used0 = int((await node.execute_command("INFO", "memory"))["used_memory"])
    batcher = ScriptBatcher(redis, client="memory-probe")
    t0 = time.monotonic()
    try:
        step = 5_000
        for start in range(0, records, step):
            await asyncio.gather(
                *(
                    # user ids of a realistic length; request ids as the issuer makes them
                    batcher.call(
                        ISSUE,
                        keys.issue_keys(eid),
                        (f"u{i:0{user_len - 1}d}", uuid.uuid4().hex[:20], "", "", ""),
                    )
                    for i in range(start, min(records, start + step))
                )
            )
        fill_s = time.monotonic() - t0
        state = await event_state.read_state(redis, eid)
        assert state is not None and state.issued == records, state
        used1 = int((await node.execute_command("INFO", "memory"))["used_memory"])
        per_key = {
            "users": await _usage(node, keys.users_key(eid)),
            "outbox": await _usage(node, keys.outbox_key(eid)),
            "cfg": await _usage(node, keys.config_key(eid)),
            "stock": await _usage(node, keys.stock_key(eid)),
        }
        # the alternative for integer ids: one bit per possible id
        bitmap_key = keys.event_tag(eid) + ":probe-bitmap"
        ids = random.sample(range(10_000_000), records)
        pipe_batch = 10_000
        for i in range(0, records, pipe_batch):
            async with redis.pipeline(transaction=False) as pipe:
                for uid in ids[i : i + pipe_batch]:
                    pipe.setbit(bitmap_key, uid, 1)
                await pipe.execute()
        bitmap = await _usage(node, bitmap_key)
        await redis.delete(bitmap_key)
    finally:
        await batcher.aclose()
        await event_state.delete_state(redis, eid)
        await redis.aclose()
    scale = 1_000_000 / records
    return {
        "records": records,
        "user_id_length": user_len,
        "fill_seconds": round(fill_s, 1),
        "bytes_per_key": per_key,
        "node_used_memory_delta": used1 - used0,
        "per_1M_participants_holding_a_coupon_MB": round(per_key["users"] * scale / 2**20, 1),
        "per_1M_coupons_in_outbox_MB": round(per_key["outbox"] * scale / 2**20, 1),
        "per_1M_coupons_total_MB": round((per_key["users"] + per_key["outbox"]) * scale / 2**20, 1),
        "bytes_per_coupon_users_hash": round(per_key["users"] / records, 1),
        "bytes_per_coupon_outbox": round(per_key["outbox"] / records, 1),
        "bitmap_10M_id_space_bytes": bitmap,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="memory_probe")
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--user-len", type=int, default=12, help="length of the user ids")
    ap.add_argument("--out", default=str(RESULTS / "memory-probe.json"))
    args = ap.parse_args(argv)
    result = asyncio.run(probe(args.records, args.user_len))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
