"""Identifiers compare byte for byte: user_coupons' user_id, code, request_id, order_id.

Revision ID: 0003
Revises: 0002

A database created without an explicit collation gets the server's default, on MySQL 8
utf8mb4_0900_ai_ci: accent- and case-insensitive. There 'josé-X', 'jose-X' and 'JOSÉ-X' are one
user_id to UNIQUE (event_id, user_id, seq) — a second shopper's coupon would be refused as a
duplicate of the first's — and a wallet lookup by user_id would return another shopper's
coupons. Codes 'Ab3' and 'AB3' would collide the same way. The local stack creates its database
with utf8mb4_bin, which hid this; the columns now say it themselves.
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

BINARY = "CHARACTER SET utf8mb4 COLLATE utf8mb4_bin"
COLUMNS = (
    ("user_id", "VARCHAR(128)", "NOT NULL"),
    ("code", "VARCHAR(32)", "NOT NULL"),
    ("request_id", "VARCHAR(64)", "NOT NULL"),
    ("order_id", "VARCHAR(64)", "NULL"),
)


def upgrade() -> None:
    changes = ", ".join(f"MODIFY {name} {kind} {BINARY} {null}" for name, kind, null in COLUMNS)
    op.execute(f"ALTER TABLE user_coupons {changes}")


def downgrade() -> None:
    # Deliberately nothing: going back to an insensitive collation could merge distinct users,
    # and a UNIQUE index rebuilt under it could refuse rows that are already stored.
    pass
