"""collective_point.size_bytes as a 64-bit integer

Collective messages above 2 GiB overflowed PostgreSQL's 32-bit INTEGER. SQLite stores integers in
up to 8 bytes already; batch mode rebuilds the table there, keeping the rows.

Revision ID: 0002
Revises: 0001
"""
import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("collective_point") as batch:
        batch.alter_column("size_bytes", existing_type=sa.Integer(), type_=sa.BigInteger(), existing_nullable=False)


def downgrade() -> None:
    # rows above 2**31-1 cannot go back to a 32-bit column: refuse rather than truncate
    bind = op.get_bind()
    too_big = bind.execute(sa.text("SELECT COUNT(*) FROM collective_point WHERE size_bytes > 2147483647")).scalar()
    if too_big:
        raise RuntimeError(f"{too_big} collective_point rows have size_bytes > 2**31-1; cannot downgrade to INTEGER")
    with op.batch_alter_table("collective_point") as batch:
        batch.alter_column("size_bytes", existing_type=sa.BigInteger(), type_=sa.Integer(), existing_nullable=False)
