"""The relay's decisions, as plain functions: what to send for a batch of outbox entries, which
entries to acknowledge after Kafka answered, when to rebuild the producer, how long to back off,
when to stop watching a stream, which dead consumers to forget, how long to let entries gather.

The one rule everything here serves: an outbox entry is acknowledged (XACK + XDEL) only after
Kafka acknowledged a record carrying it — the record itself, or its dead-letter copy when the
entry can never be decoded. Anything else stays pending and is sent again (duplicates are fine,
the persister is idempotent; loss is not).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from flashcoupon_common.messages import CouponIssued, SchemaError

# Kafka's default max.message.bytes is ~1 MB; a record above this would be refused forever.
MAX_RECORD_BYTES = 900_000
# Field values copied into a dead-letter record are cut to this length (the DLQ must accept it).
DLQ_FIELD_CHARS = 4_096

Fields = Mapping[bytes | str, bytes | str]

# `error-code` header values of the relay's dead letters.
UNDECODABLE = "OUTBOX_UNDECODABLE"
TOO_LARGE = "RECORD_TOO_LARGE"


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One Kafka record to send on behalf of one outbox entry."""

    entry_id: str
    topic: str
    key: bytes
    value: bytes
    headers: list[tuple[str, bytes]]
    dead_letter: bool = False


@dataclass
class BatchPlan:
    outgoing: list[Outgoing] = field(default_factory=list)
    # Pending ids whose entry is already deleted (a relay died between XDEL and XACK; Redis
    # returns them with no fields): it was delivered before, so it is only acknowledged.
    gone: list[str] = field(default_factory=list)
    # (entry id, reason) of entries that go to the dead-letter topic.
    poison: list[tuple[str, str]] = field(default_factory=list)


def _text(v: bytes | str) -> str:
    return v.decode("utf-8", "backslashreplace") if isinstance(v, bytes) else v


def dead_letter(
    stream: str,
    event_id: str,
    entry_id: str,
    fields: Fields,
    detail: str,
    topic: str,
    code: str = UNDECODABLE,
) -> Outgoing:
    """The raw entry, as JSON, with the reason: enough for a human to repair it by hand.

    Headers follow the persister's dead-letter layout (same topic): `reason`, `error-code`,
    `error-detail`; `dead-lettered-by: relay` and the stream coordinates say where it came
    from. The value is not a coupon record, so it is not replayable as it is.
    """
    raw = {_text(k)[:DLQ_FIELD_CHARS]: _text(v)[:DLQ_FIELD_CHARS] for k, v in fields.items()}
    body = {"stream": stream, "id": entry_id, "eventId": event_id, "reason": detail, "fields": raw}
    headers = [
        ("reason", b"schema"),
        ("error-code", code.encode()),
        ("error-detail", detail.encode()[:1000]),
        ("dead-lettered-by", b"relay"),
        ("event-id", event_id.encode()),
        ("outbox-stream", stream.encode()),
        ("outbox-id", entry_id.encode()),
    ]
    return Outgoing(entry_id, topic, event_id.encode(), orjson.dumps(body), headers, True)


def plan_batch(
    stream: str,
    event_id: str,
    entries: Iterable[tuple[bytes | str, Fields | None]],
    *,
    topic: str,
    dlq_topic: str,
) -> BatchPlan:
    """Turn XREADGROUP/XAUTOCLAIM entries into records to send (or to dead-letter)."""
    plan = BatchPlan()
    for raw_id, fields in entries:
        entry_id = _text(raw_id)
        if not fields:  # XADD needs a field, so an empty entry is one deleted since reading
            plan.gone.append(entry_id)
            continue
        code = UNDECODABLE
        try:
            record, tp = CouponIssued.read_outbox(fields)
            value = record.encode()
            if len(value) > MAX_RECORD_BYTES:
                code = TOO_LARGE
                raise SchemaError(f"record is {len(value)} bytes, above {MAX_RECORD_BYTES}")
        except ValueError as exc:  # SchemaError, or bytes that are not UTF-8
            reason = str(exc) if isinstance(exc, SchemaError) else f"undecodable: {exc}"
            plan.poison.append((entry_id, reason))
            letter = dead_letter(stream, event_id, entry_id, fields, reason, dlq_topic, code)
            plan.outgoing.append(letter)
            continue
        headers = [
            ("request-id", record.request_id.encode()),
            ("event-id", record.event_id.encode()),
            ("outbox-id", entry_id.encode()),
        ]
        if tp:
            headers.insert(0, ("traceparent", tp.encode()))
        plan.outgoing.append(Outgoing(entry_id, topic, record.kafka_key(), value, headers))
    return plan


Partitioner = Callable[[bytes, list[int], list[int]], int]


def by_partition(
    batch: Sequence[Outgoing], partitions: Mapping[str, list[int]], partitioner: Partitioner
) -> dict[tuple[str, int], list[int]]:
    """Indices of the batch per (topic, partition), in batch order.

    The relay builds one record batch per partition itself (far cheaper per record than
    producer.send); `partitioner` is the producer's default (Java-compatible murmur2 of the
    key), so a user's records land where plain send() would put them, in the same order.
    """
    out: dict[tuple[str, int], list[int]] = {}
    for i, o in enumerate(batch):
        parts = partitions[o.topic]
        out.setdefault((o.topic, partitioner(o.key, parts, parts)), []).append(i)
    return out


def split_results(
    sent: Sequence[Outgoing], results: Sequence[Any]
) -> tuple[list[Outgoing], list[Outgoing], BaseException | None]:
    """(acknowledged by Kafka, to send again, first error). A result is an exception or not."""
    done: list[Outgoing] = []
    again: list[Outgoing] = []
    first: BaseException | None = None
    for item, result in zip(sent, results, strict=True):
        if isinstance(result, BaseException):
            again.append(item)
            first = first or result
        else:
            done.append(item)
    return done, again, first


def gather_pause(read: int, batch_size: int, gather_ms: int) -> float:
    """Seconds to wait before the next read after delivering `read` entries.

    A short read means the relay has caught up and the issuers are writing a trickle: reading
    again at once would relay it a few entries at a time, and every batch costs a Kafka
    produce, an ack, XACK/XDEL, a persister fetch and a MySQL transaction whatever its size.
    In a 2-core demo the relay, Kafka and the persister then took about half a core from the
    gateways and issuers during the drop (a quarter with 50 ms; docs/relay.md). Waiting
    gather_ms lets entries gather into one batch; a full read means a backlog: read at once.
    """
    return gather_ms / 1000 if 0 < read < batch_size else 0.0


def should_retire(in_registry: bool, length: int, pending: int) -> bool:
    """Stop watching a stream once its event left the registry AND nothing is left in it:
    an event deleted with undelivered entries still gets them delivered."""
    return not in_registry and length == 0 and pending == 0


def consumers_to_forget(
    consumers: Iterable[Mapping[str, Any]], *, me: str, idle_ms: int
) -> list[str]:
    """Group members that hold nothing and have been silent for idle_ms: dead relay pods.
    A consumer with pending entries is never forgotten (DELCONSUMER would drop its entries
    from the pending list, and nobody could claim them any more)."""
    out = []
    for c in consumers:
        name = _text(c["name"])
        if name != me and int(c["pending"]) == 0 and int(c["idle"]) >= idle_ms:
            out.append(name)
    return out


def entry_age_seconds(entry_id: bytes | str, now_ms: int) -> float:
    """Age of a stream entry from its id (<ms>-<seq>, stamped by the Redis server)."""
    ms = int(_text(entry_id).split("-", 1)[0])
    return max(0.0, (now_ms - ms) / 1000)
