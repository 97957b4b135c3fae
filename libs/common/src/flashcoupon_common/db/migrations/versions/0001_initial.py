"""Initial schema: coupon_events, coupon_tiers, user_coupons.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.mysql import DATETIME

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

DISCOUNT = sa.Enum("fixed", "percent", name="discount_type")
STATUS = sa.Enum("issued", "redeemed", "expired", name="coupon_status")
DATETIME3 = DATETIME(fsp=3)
NOW = sa.text("CURRENT_TIMESTAMP(3)")


def upgrade() -> None:
    op.create_table(
        "coupon_events",
        sa.Column("id", sa.String(63), primary_key=True),
        sa.Column("title", sa.String(255), nullable=False),
        sa.Column("quantity", sa.Integer, nullable=False),
        sa.Column("per_user_limit", sa.SmallInteger, nullable=False),
        sa.Column("start_at", DATETIME3, nullable=False),
        sa.Column("end_at", DATETIME3, nullable=False),
        sa.Column("valid_for_seconds", sa.Integer, nullable=False),
        sa.Column("spec", sa.Text, nullable=False),
        sa.Column("created_at", DATETIME3, nullable=False, server_default=NOW),
        sa.Column("updated_at", DATETIME3, nullable=False, server_default=NOW),
        sa.Column("deleted_at", DATETIME3, nullable=True),
        mysql_engine="InnoDB",
    )
    op.create_table(
        "coupon_tiers",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("event_id", sa.String(63), sa.ForeignKey("coupon_events.id"), nullable=False),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("discount_type", DISCOUNT, nullable=False),
        sa.Column("amount", sa.BigInteger, nullable=True),
        sa.Column("percent", sa.SmallInteger, nullable=True),
        sa.Column("max_amount", sa.BigInteger, nullable=True),
        sa.Column("share", sa.SmallInteger, nullable=False),
        sa.Column("quantity", sa.Integer, nullable=False),
        sa.UniqueConstraint("event_id", "name", name="uq_tier_event_name"),
        mysql_engine="InnoDB",
    )
    op.create_table(
        "user_coupons",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("event_id", sa.String(63), sa.ForeignKey("coupon_events.id"), nullable=False),
        sa.Column("user_id", sa.String(128), nullable=False),
        sa.Column("seq", sa.SmallInteger, nullable=False),
        sa.Column("code", sa.String(32), nullable=False),
        sa.Column("tier", sa.String(63), nullable=False),
        sa.Column("discount_type", DISCOUNT, nullable=False),
        sa.Column("amount", sa.BigInteger, nullable=True),
        sa.Column("percent", sa.SmallInteger, nullable=True),
        sa.Column("max_amount", sa.BigInteger, nullable=True),
        sa.Column("status", STATUS, nullable=False, server_default="issued"),
        sa.Column("issued_at", DATETIME3, nullable=False),
        sa.Column("expires_at", DATETIME3, nullable=False),
        sa.Column("request_id", sa.String(64), nullable=False),
        sa.Column("persisted_at", DATETIME3, nullable=False, server_default=NOW),
        sa.Column("redeemed_at", DATETIME3, nullable=True),
        sa.Column("order_id", sa.String(64), nullable=True),
        sa.Column("order_amount", sa.BigInteger, nullable=True),
        sa.Column("discount_amount", sa.BigInteger, nullable=True),
        sa.UniqueConstraint("event_id", "user_id", "seq", name="uq_user_coupon_slot"),
        sa.UniqueConstraint("code", name="uq_user_coupon_code"),
        mysql_engine="InnoDB",
    )
    op.create_index("ix_user_coupons_user", "user_coupons", ["user_id", "issued_at"])
    op.create_index("ix_user_coupons_event_status", "user_coupons", ["event_id", "status"])


def downgrade() -> None:
    op.drop_table("user_coupons")
    op.drop_table("coupon_tiers")
    op.drop_table("coupon_events")
