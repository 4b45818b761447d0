"""observed_run.mfu_flops: the FLOP count a measured MFU was logged in

A measured MFU is a step time only together with the FLOP count of the run that logged it
(calibrate/flops.py: '6n', 'eq-mfu', 'megatron'); imports now store the step time and keep an MFU
only with its count. Rows stored before carry no count: they keep their MFU, the column stays
NULL, and the calibration leaves an MFU-only row without a count out (re-add it with --mfu-flops).

Revision ID: 0005
Revises: 0004
"""
import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


# plain ADD/DROP COLUMN (nullable, no default): the same statement on SQLite and PostgreSQL, and no
# batch-mode table rebuild on SQLite


def upgrade() -> None:
    op.add_column("observed_run", sa.Column("mfu_flops", sa.String(length=16), nullable=True))


def downgrade() -> None:
    op.drop_column("observed_run", "mfu_flops")
