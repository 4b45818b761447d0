"""allocator_point: caching-allocator overhead measured by the bench suite 'allocator'

Peak allocated vs reserved bytes of a few reference-model training steps on a GPU, the memory
outside the allocator, and the memory model's predicted peak for the same configuration.

Revision ID: 0003
Revises: 0002
"""
import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "allocator_point",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("layers", sa.Integer(), nullable=False),
        sa.Column("hidden", sa.Integer(), nullable=False),
        sa.Column("experts", sa.Integer(), nullable=False),
        sa.Column("k", sa.Integer(), nullable=False),
        sa.Column("seq_len", sa.Integer(), nullable=False),
        sa.Column("micro_bs", sa.Integer(), nullable=False),
        sa.Column("ckpt", sa.String(length=24), nullable=False),
        sa.Column("dtype", sa.String(length=16), nullable=False),
        sa.Column("step_s", sa.Float(), nullable=True),
        sa.Column("max_allocated_bytes", sa.BigInteger(), nullable=True),
        sa.Column("max_reserved_bytes", sa.BigInteger(), nullable=True),
        sa.Column("allocator_fraction", sa.Float(), nullable=True),
        sa.Column("context_bytes", sa.BigInteger(), nullable=True),
        sa.Column("predicted_allocated_bytes", sa.Float(), nullable=True),
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("n_rep", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.text("(CURRENT_TIMESTAMP)"),
                  nullable=False),
        sa.CheckConstraint("status <> 'OK' OR step_s IS NOT NULL", name="step_s_present_when_ok"),
        sa.CheckConstraint("status IN ('OK', 'OOM', 'UNSUPPORTED', 'SKIP_MEM', 'SKIP_ALIGN', 'ERROR')",
                           name="status_known"),
        sa.CheckConstraint("step_s IS NULL OR (step_s > 0 AND step_s < 1e300)", name="step_s_finite_positive"),
        sa.CheckConstraint("layers > 0 AND hidden > 0 AND experts > 0 AND k > 0 AND seq_len > 0 AND micro_bs > 0",
                           name="allocator_dims_positive"),
        sa.ForeignKeyConstraint(["run_id"], ["bench_run.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("run_id", "layers", "hidden", "experts", "k", "seq_len", "micro_bs", "ckpt", "dtype"),
    )
    with op.batch_alter_table("allocator_point", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_allocator_point_run_id"), ["run_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("allocator_point", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_allocator_point_run_id"))
    op.drop_table("allocator_point")
