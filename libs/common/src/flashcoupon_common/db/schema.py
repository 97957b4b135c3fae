"""The MySQL tables, as SQLAlchemy Core metadata.

The migrations under `migrations/versions/` create exactly these tables; a test compares the
two. `user_coupons` carries the two constraints that make Kafka redelivery harmless:
UNIQUE (event_id, user_id, seq) — one row per allowance slot — and UNIQUE (code).
`redeemed_outbox` holds `coupon-redeemed` messages written in the redemption's transaction
until the wallet's publisher has them acknowledged by Kafka (docs/wallet.md).
"""

from __future__ import annotations

from sqlalchemy import (
    VARBINARY,
    BigInteger,
    Column,
    Enum,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
    UniqueConstraint,
    func,
)
from sqlalchemy.dialects.mysql import DATETIME

metadata = MetaData()

DATETIME3 = DATETIME(fsp=3)

EVENT_ID = String(63)  # a Kubernetes object name
# Identifiers compare byte for byte whatever the database's default collation (migration 0003).
BINARY = "utf8mb4_bin"
USER_ID = String(128, collation=BINARY)
CODE = String(32, collation=BINARY)
DISCOUNT_TYPE = Enum("fixed", "percent", name="discount_type")

coupon_events = Table(
    "coupon_events",
    metadata,
    Column("id", EVENT_ID, primary_key=True),
    Column("title", String(255), nullable=False),
    Column("quantity", Integer, nullable=False),
    Column("per_user_limit", SmallInteger, nullable=False),
    Column("start_at", DATETIME3, nullable=False),
    Column("end_at", DATETIME3, nullable=False),
    Column("valid_for_seconds", Integer, nullable=False),
    Column("spec", Text, nullable=False),  # the applied manifest spec, as JSON
    Column("created_at", DATETIME3, nullable=False, server_default=func.now(3)),
    Column("updated_at", DATETIME3, nullable=False, server_default=func.now(3)),
    # Deleting a CouponEvent keeps its history: the row is marked, not removed.
    Column("deleted_at", DATETIME3, nullable=True),
    mysql_engine="InnoDB",
)

coupon_tiers = Table(
    "coupon_tiers",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("event_id", EVENT_ID, ForeignKey("coupon_events.id"), nullable=False),
    Column("name", String(63), nullable=False),
    Column("discount_type", DISCOUNT_TYPE, nullable=False),
    Column("amount", BigInteger, nullable=True),
    Column("percent", SmallInteger, nullable=True),
    Column("max_amount", BigInteger, nullable=True),
    Column("share", SmallInteger, nullable=False),
    Column("quantity", Integer, nullable=False),
    UniqueConstraint("event_id", "name", name="uq_tier_event_name"),
    mysql_engine="InnoDB",
)

user_coupons = Table(
    "user_coupons",
    metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("event_id", EVENT_ID, ForeignKey("coupon_events.id"), nullable=False),
    Column("user_id", USER_ID, nullable=False),
    Column("seq", SmallInteger, nullable=False),
    Column("code", CODE, nullable=False),
    Column("tier", String(63), nullable=False),
    Column("discount_type", DISCOUNT_TYPE, nullable=False),
    Column("amount", BigInteger, nullable=True),
    Column("percent", SmallInteger, nullable=True),
    Column("max_amount", BigInteger, nullable=True),
    Column(
        "status",
        Enum("issued", "redeemed", "expired", name="coupon_status"),
        nullable=False,
        server_default="issued",
    ),
    Column("issued_at", DATETIME3, nullable=False),
    Column("expires_at", DATETIME3, nullable=False),
    Column("request_id", String(64, collation=BINARY), nullable=False),
    Column("persisted_at", DATETIME3, nullable=False, server_default=func.now(3)),
    Column("redeemed_at", DATETIME3, nullable=True),
    Column("order_id", String(64, collation=BINARY), nullable=True),
    Column("order_amount", BigInteger, nullable=True),
    Column("discount_amount", BigInteger, nullable=True),
    UniqueConstraint("event_id", "user_id", "seq", name="uq_user_coupon_slot"),
    UniqueConstraint("code", name="uq_user_coupon_code"),
    Index("ix_user_coupons_user", "user_id", "issued_at"),
    Index("ix_user_coupons_event_status", "event_id", "status"),
    mysql_engine="InnoDB",
)

redeemed_outbox = Table(
    "redeemed_outbox",
    metadata,
    # Publishers drain in id order; ids are only an order, not a watermark: a lower id may
    # commit after a higher one, so an entry is removed by its id once Kafka acknowledged it.
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("kafka_key", VARBINARY(512), nullable=False),  # the user id, UTF-8
    # The versioned message exactly as it is sent (CouponRedeemed.encode(), JSON).
    Column("payload", LargeBinary, nullable=False),
    Column("created_at", DATETIME3, nullable=False, server_default=func.now(3)),
    mysql_engine="InnoDB",
)
