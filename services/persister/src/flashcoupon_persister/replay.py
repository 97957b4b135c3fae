"""`python -m flashcoupon_persister.replay`: list dead letters, or send them back once fixed.

    python -m flashcoupon_persister.replay                       # counts by reason/code
    python -m flashcoupon_persister.replay --code MYSQL_1452 --apply
    python -m flashcoupon_persister.replay --since-offset 1200 --apply

Reads the DLQ from --since-offset (default: the beginning) up to its end at start-up, and with
--apply re-produces each matching record — original key and value, byte for byte — to the
topic named in its `original-topic` header, through the normal pipeline (the persister's
idempotent writes make a replay of an already stored coupon a no-op). A record that fails
again is dead-lettered again, at a new offset. The tool keeps no state: it prints the DLQ's
end offset, to pass as --since-offset next time.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections import Counter
from dataclasses import dataclass, field

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from flashcoupon_common.kafka_producer import idempotent_producer_factory
from flashcoupon_common.logsetup import configure_logging
from flashcoupon_common.settings import KafkaSettings, settings_or_exit

from .settings import PersisterSettings

logger = logging.getLogger(__name__)


@dataclass
class ReplayReport:
    scanned: int = 0
    matched: int = 0
    replayed: int = 0
    by_code: Counter[str] = field(default_factory=Counter)
    end_offsets: dict[int, int] = field(default_factory=dict)


def matches(headers: dict[str, bytes], code: str | None, reason: str | None) -> bool:
    if code is not None and headers.get("error-code", b"").decode() != code:
        return False
    return reason is None or headers.get("reason", b"").decode() == reason


async def replay(
    kafka: KafkaSettings,
    dlq_topic: str,
    *,
    code: str | None = None,
    reason: str | None = None,
    since_offset: int = 0,
    apply: bool = False,
    to_topic: str | None = None,
) -> ReplayReport:
    report = ReplayReport()
    consumer = AIOKafkaConsumer(bootstrap_servers=kafka.bootstrap, enable_auto_commit=False)
    producer = idempotent_producer_factory(kafka.bootstrap)()
    await consumer.start()
    await producer.start()
    try:
        tps = [TopicPartition(dlq_topic, p) for p in await _partitions(kafka, dlq_topic)]
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        report.end_offsets = {tp.partition: off for tp, off in ends.items()}
        for tp in tps:
            consumer.seek(tp, min(since_offset, ends[tp]))
        futures = []
        remaining = {tp for tp in tps if ends[tp] > min(since_offset, ends[tp])}
        while remaining:
            batch = await consumer.getmany(*remaining, timeout_ms=1000)
            for tp, records in batch.items():
                for r in records:
                    if r.offset >= ends[tp]:
                        remaining.discard(tp)
                        break
                    report.scanned += 1
                    headers = {k: v for k, v in (r.headers or ())}
                    report.by_code[headers.get("error-code", b"?").decode()] += 1
                    if not matches(headers, code, reason):
                        continue
                    report.matched += 1
                    if apply:
                        target = to_topic or headers["original-topic"].decode()
                        replay_headers = [
                            ("replayed-from", f"{dlq_topic}/{r.partition}/{r.offset}".encode())
                        ]
                        futures.append(
                            await producer.send(
                                target, value=r.value, key=r.key, headers=replay_headers
                            )
                        )
                if await consumer.position(tp) >= ends[tp]:
                    remaining.discard(tp)
        await asyncio.gather(*futures)
        report.replayed = len(futures)
    finally:
        await producer.stop()
        await consumer.stop()
    return report


async def _partitions(kafka: KafkaSettings, topic: str) -> list[int]:
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    await admin.start()
    try:
        (described,) = await admin.describe_topics([topic])
    finally:
        await admin.close()
    if described["error_code"] != 0 or not described["partitions"]:
        raise SystemExit(f"topic {topic!r} not found (error {described['error_code']})")
    return sorted(p["partition"] for p in described["partitions"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m flashcoupon_persister.replay")
    parser.add_argument("--dlq-topic", help="default: FLASHCOUPON_PERSISTER_DLQ_TOPIC")
    parser.add_argument("--code", help="only this error-code (e.g. MYSQL_1452)")
    parser.add_argument("--reason", help="only this reason (schema|conflict|constraint|invalid)")
    parser.add_argument("--since-offset", type=int, default=0)
    parser.add_argument("--to-topic", help="override the original-topic header")
    parser.add_argument("--apply", action="store_true", help="re-produce (default: list only)")
    args = parser.parse_args(argv)
    configure_logging("persister-replay")
    settings = settings_or_exit("flashcoupon_persister.replay", PersisterSettings.from_env)
    report = asyncio.run(
        replay(
            settings.kafka,
            args.dlq_topic or settings.dlq_topic,
            code=args.code,
            reason=args.reason,
            since_offset=args.since_offset,
            apply=args.apply,
            to_topic=args.to_topic,
        )
    )
    logger.info(
        "scanned=%d matched=%d replayed=%d by_code=%s end_offsets=%s",
        report.scanned,
        report.matched,
        report.replayed,
        dict(report.by_code),
        report.end_offsets,
    )


if __name__ == "__main__":
    main()
