"""calibration.stack: the training stack a calibration was fitted on

A calibration belongs to the stack its runs ran (scaleplan/stack.py, ``Stack.key``): the kernel counts,
host costs and fusions it fits are that stack's, and it is never applied to a plan of another. Rows
stored before carry none: NULL is the paper's stack ("megatron"), which every earlier fit ran on.

Revision ID: 0006
Revises: 0005
"""
import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


# plain ADD/DROP COLUMN (nullable, no default): the same statement on SQLite and PostgreSQL


def upgrade() -> None:
    op.add_column("calibration", sa.Column("stack", sa.String(length=256), nullable=True))


def downgrade() -> None:
    op.drop_column("calibration", "stack")
