"""bench_run.as_profile, and the GPU name of imported runs per profile

``as_profile``: true for a run stored under a profile whose GPU is not the device it ran on
(``bench run --as-profile``); the tables read such a run only because the user forced it.

Imported runs took the GPU name of their source file's first row for every profile in the file
(sdpa_fwd_bwd_timings: A100, H200 and B200 rows, all labelled A100), and files without a GPU
column (gemm_util, sdpa) had none: each is set to the GPU of the profile the rows belong to.

Revision ID: 0004
Revises: 0003
"""
import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# the built-in profiles' GPUs at the time of this migration (cluster_profiles/*.yaml gpu_name)
_GPU = {"p6-b200.48xlarge": "NVIDIA B200", "p5en.48xlarge": "NVIDIA H200", "h200-single": "NVIDIA H200",
        "p5.48xlarge": "NVIDIA H100 80GB HBM3", "p4d.24xlarge": "NVIDIA A100-SXM4-40GB"}


# plain ADD/DROP COLUMN, not batch mode: batch would rebuild bench_run on SQLite, and dropping the old
# table with foreign keys on cascades into every measurement table (SQLite >= 3.35 drops columns)


def upgrade() -> None:
    op.add_column("bench_run",
                  sa.Column("as_profile", sa.Boolean(), nullable=False, server_default=sa.false()))
    run = sa.table("bench_run", sa.column("profile", sa.String), sa.column("source", sa.String),
                   sa.column("gpu_name", sa.String))
    for profile, gpu in _GPU.items():
        op.execute(run.update().where(run.c.source == "imported", run.c.profile == profile)
                   .values(gpu_name=gpu))


def downgrade() -> None:
    op.drop_column("bench_run", "as_profile")
