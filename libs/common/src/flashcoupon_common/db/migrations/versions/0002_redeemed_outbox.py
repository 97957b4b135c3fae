"""redeemed_outbox: coupon-redeemed messages committed with their redemption.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.mysql import DATETIME

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "redeemed_outbox",
        sa.Column("id", sa.BigInteger, primary_key=True, autoincrement=True),
        sa.Column("kafka_key", sa.VARBINARY(512), nullable=False),
        sa.Column("payload", sa.LargeBinary, nullable=False),
        sa.Column(
            "created_at",
            DATETIME(fsp=3),
            nullable=False,
            server_default=sa.text("CURRENT_TIMESTAMP(3)"),
        ),
        mysql_engine="InnoDB",
    )


def downgrade() -> None:
    # Entries still here were never acknowledged by Kafka; dropping them loses those events.
    # docs/wallet.md says how to drain the table first.
    op.drop_table("redeemed_outbox")
