"""initial schema

Revision ID: 0001
Revises: 
Create Date: 2026-11-21 01:09:35.383281
"""
from alembic import op
import sqlalchemy as sa


revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('bench_run',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('suite', sa.String(length=32), nullable=False),
    sa.Column('profile', sa.String(length=128), nullable=False),
    sa.Column('source', sa.String(length=16), nullable=False),
    sa.Column('source_file', sa.String(length=512), nullable=True),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('preset', sa.String(length=256), nullable=True),
    sa.Column('config', sa.JSON(), nullable=True),
    sa.Column('config_hash', sa.String(length=64), nullable=True),
    sa.Column('host', sa.String(length=256), nullable=True),
    sa.Column('device', sa.String(length=32), nullable=True),
    sa.Column('gpu_name', sa.String(length=128), nullable=True),
    sa.Column('gpu_uuid', sa.String(length=128), nullable=True),
    sa.Column('driver_version', sa.String(length=64), nullable=True),
    sa.Column('cuda_version', sa.String(length=64), nullable=True),
    sa.Column('torch_version', sa.String(length=64), nullable=True),
    sa.Column('nccl_version', sa.String(length=64), nullable=True),
    sa.Column('te_version', sa.String(length=64), nullable=True),
    sa.Column('git_rev', sa.String(length=64), nullable=True),
    sa.Column('world_size', sa.Integer(), nullable=True),
    sa.Column('nvml_start', sa.JSON(), nullable=True),
    sa.Column('nvml_end', sa.JSON(), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('ended_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('notes', sa.Text(), nullable=True),
    sa.CheckConstraint("status IN ('running', 'complete', 'interrupted', 'failed', 'imported')", name='run_status_known'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('source_file', 'suite', name='uq_bench_run_source_file')
    )
    with op.batch_alter_table('bench_run', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_bench_run_config_hash'), ['config_hash'], unique=False)
        batch_op.create_index(batch_op.f('ix_bench_run_profile'), ['profile'], unique=False)
        batch_op.create_index(batch_op.f('ix_bench_run_suite'), ['suite'], unique=False)

    op.create_table('calibration',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('profile', sa.String(length=128), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('coefficients', sa.JSON(), nullable=False),
    sa.Column('inputs', sa.JSON(), nullable=True),
    sa.Column('residuals', sa.JSON(), nullable=True),
    sa.Column('cv_error', sa.Float(), nullable=True),
    sa.Column('n_obs', sa.Integer(), nullable=False),
    sa.Column('notes', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('profile', 'kind', 'version')
    )
    with op.batch_alter_table('calibration', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_calibration_profile'), ['profile'], unique=False)

    op.create_table('hardware_profile',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('gpu_name', sa.String(length=128), nullable=False),
    sa.Column('gpus_per_node', sa.Integer(), nullable=False),
    sa.Column('peak_flops', sa.JSON(), nullable=False),
    sa.Column('hbm_bytes', sa.Double(), nullable=False),
    sa.Column('hbm_bandwidth', sa.Double(), nullable=False),
    sa.Column('scaleup_bandwidth', sa.Double(), nullable=False),
    sa.Column('scaleout_bandwidth', sa.Double(), nullable=False),
    sa.Column('source', sa.Text(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('name')
    )
    op.create_table('law_fit',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('dataset', sa.String(length=256), nullable=True),
    sa.Column('coefficients', sa.JSON(), nullable=False),
    sa.Column('ci95', sa.JSON(), nullable=True),
    sa.Column('heldout_rmse', sa.Float(), nullable=True),
    sa.Column('identified', sa.JSON(), nullable=True),
    sa.Column('n_runs', sa.Integer(), nullable=False),
    sa.Column('settings', sa.JSON(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id')
    )
    op.create_table('law_run',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('dataset', sa.String(length=256), nullable=False),
    sa.Column('n_tot', sa.Double(), nullable=False),
    sa.Column('n_act', sa.Double(), nullable=False),
    sa.Column('s', sa.Double(), nullable=False),
    sa.Column('g', sa.Double(), nullable=False),
    sa.Column('d', sa.Double(), nullable=False),
    sa.Column('loss', sa.Double(), nullable=False),
    sa.Column('e', sa.Integer(), nullable=False),
    sa.Column('k', sa.Integer(), nullable=False),
    sa.Column('layers', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint('n_tot > 0 AND n_act > 0 AND d > 0 AND g > 0 AND loss > 0 AND loss < 1e300', name='law_run_positive'),
    sa.CheckConstraint('s >= 0 AND s < 1', name='law_run_sparsity'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('dataset', 'n_tot', 'n_act', 'g', 'd', 'e', 'k', 'layers')
    )
    op.create_table('observed_run',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('dedup_key', sa.String(length=128), nullable=False),
    sa.Column('source', sa.String(length=256), nullable=False),
    sa.Column('sweep', sa.String(length=128), nullable=True),
    sa.Column('model_name', sa.String(length=128), nullable=True),
    sa.Column('spec', sa.JSON(), nullable=False),
    sa.Column('profile', sa.String(length=128), nullable=False),
    sa.Column('n_devices', sa.Integer(), nullable=False),
    sa.Column('gbs', sa.Integer(), nullable=False),
    sa.Column('seqlen', sa.Integer(), nullable=False),
    sa.Column('tp', sa.Integer(), nullable=False),
    sa.Column('cp', sa.Integer(), nullable=False),
    sa.Column('pp', sa.Integer(), nullable=False),
    sa.Column('dp', sa.Integer(), nullable=False),
    sa.Column('ep', sa.Integer(), nullable=False),
    sa.Column('etp', sa.Integer(), nullable=False),
    sa.Column('vpp', sa.Integer(), nullable=False),
    sa.Column('mbs', sa.Integer(), nullable=False),
    sa.Column('ckpt', sa.String(length=32), nullable=False),
    sa.Column('measured_t_iter_s', sa.Float(), nullable=True),
    sa.Column('measured_mfu', sa.Float(), nullable=True),
    sa.Column('measured_mfu_norm', sa.Float(), nullable=True),
    sa.Column('measured_peak_mem_gb', sa.Float(), nullable=True),
    sa.Column('predicted_t_iter_s', sa.Float(), nullable=True),
    sa.Column('reference_mfu', sa.Float(), nullable=True),
    sa.Column('extra', sa.JSON(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint('measured_mfu IS NULL OR (measured_mfu > 0 AND measured_mfu < 1e300)', name='measured_mfu_finite_positive'),
    sa.CheckConstraint('measured_mfu_norm IS NULL OR (measured_mfu_norm > 0 AND measured_mfu_norm < 1e300)', name='measured_mfu_norm_finite_positive'),
    sa.CheckConstraint('measured_peak_mem_gb IS NULL OR (measured_peak_mem_gb > 0 AND measured_peak_mem_gb < 1e300)', name='measured_peak_mem_gb_finite_positive'),
    sa.CheckConstraint('measured_t_iter_s IS NOT NULL OR measured_mfu IS NOT NULL OR measured_mfu_norm IS NOT NULL', name='obs_has_measurement'),
    sa.CheckConstraint('measured_t_iter_s IS NULL OR (measured_t_iter_s > 0 AND measured_t_iter_s < 1e300)', name='measured_t_iter_s_finite_positive'),
    sa.CheckConstraint('n_devices > 0 AND gbs > 0 AND seqlen > 0', name='obs_sizes_positive'),
    sa.CheckConstraint('predicted_t_iter_s IS NULL OR (predicted_t_iter_s > 0 AND predicted_t_iter_s < 1e300)', name='predicted_t_iter_s_finite_positive'),
    sa.CheckConstraint('tp > 0 AND cp > 0 AND pp > 0 AND dp > 0 AND ep > 0 AND etp > 0 AND vpp > 0 AND mbs > 0', name='obs_layout_positive'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('dedup_key')
    )
    with op.batch_alter_table('observed_run', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_observed_run_profile'), ['profile'], unique=False)
        batch_op.create_index(batch_op.f('ix_observed_run_sweep'), ['sweep'], unique=False)

    op.create_table('collective_point',
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('collective', sa.String(length=32), nullable=False),
    sa.Column('group_size', sa.Integer(), nullable=False),
    sa.Column('world_size', sa.Integer(), nullable=True),
    sa.Column('layout', sa.String(length=16), nullable=False),
    sa.Column('inter_node', sa.Boolean(), nullable=False),
    sa.Column('size_bytes', sa.Integer(), nullable=False),
    sa.Column('dtype', sa.String(length=16), nullable=False),
    sa.Column('t_s', sa.Float(), nullable=True),
    sa.Column('t_p10_s', sa.Float(), nullable=True),
    sa.Column('t_p90_s', sa.Float(), nullable=True),
    sa.Column('algbw_gbps', sa.Float(), nullable=True),
    sa.Column('busbw_gbps', sa.Float(), nullable=True),
    sa.Column('backend', sa.String(length=16), nullable=True),
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('note', sa.Text(), nullable=True),
    sa.Column('n_rep', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('(CURRENT_TIMESTAMP)'), nullable=False),
    sa.CheckConstraint("status <> 'OK' OR t_s IS NOT NULL", name='t_s_present_when_ok'),
    sa.CheckConstraint("status IN ('OK', 'OOM', 'UNSUPPORTED', 'SKIP_MEM', 'SKIP_ALIGN', 'ERROR')", name='status_known'),
    sa.CheckConstraint('group_size > 0 AND size_bytes > 0', name='collective_dims_positive'),
    sa.CheckConstraint('t_p10_s IS NULL OR (t_p10_s > 0 AND t_p10_s < 1e300)', name='t_p10_s_finite_positive'),
    sa.CheckConstraint('t_p90_s IS NULL OR (t_p90_s > 0 AND t_p90_s < 1e300)', name='t_p90_s_finite_positive'),
    sa.CheckConstraint('t_s IS NULL OR (t_s > 0 AND t_s < 1e300)', name='t_s_finite_positive'),
    sa.ForeignKeyConstraint(['run_id'], ['bench_run.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('run_id', 'collective', 'group_size', 'layout', 'inter_node', 'size_bytes', 'dtype')
    )
    with op.batch_alter_table('collective_point', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_collective_point_run_id'), ['run_id'], unique=False)

    op.create_table('dispatch_point',
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('mode', sa.String(length=32), nullable=False),
    sa.Column('m', sa.Integer(), nullable=False),
    sa.Column('n', sa.Integer(), nullable=False),
    sa.Column('k', sa.Integer(), nullable=False),
    sa.Column('dtype', sa.String(length=16), nullable=False),
    sa.Column('chain_len', sa.Integer(), nullable=False),
    sa.Column('wall_per_kernel_s', sa.Float(), nullable=True),
    sa.Column('active_per_kernel_s', sa.Float(), nullable=True),
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('note', sa.Text(), nullable=True),
    sa.Column('n_rep', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('(CURRENT_TIMESTAMP)'), nullable=False),
    sa.CheckConstraint("status <> 'OK' OR wall_per_kernel_s IS NOT NULL", name='wall_per_kernel_s_present_when_ok'),
    sa.CheckConstraint("status IN ('OK', 'OOM', 'UNSUPPORTED', 'SKIP_MEM', 'SKIP_ALIGN', 'ERROR')", name='status_known'),
    sa.CheckConstraint('active_per_kernel_s IS NULL OR (active_per_kernel_s > 0 AND active_per_kernel_s < 1e300)', name='active_per_kernel_s_finite_positive'),
    sa.CheckConstraint('wall_per_kernel_s IS NULL OR (wall_per_kernel_s > 0 AND wall_per_kernel_s < 1e300)', name='wall_per_kernel_s_finite_positive'),
    sa.ForeignKeyConstraint(['run_id'], ['bench_run.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('run_id', 'mode', 'm', 'n', 'k', 'dtype', 'chain_len')
    )
    with op.batch_alter_table('dispatch_point', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_dispatch_point_run_id'), ['run_id'], unique=False)

    op.create_table('elementwise_point',
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('op', sa.String(length=32), nullable=False),
    sa.Column('tokens', sa.Integer(), nullable=False),
    sa.Column('hidden', sa.Integer(), nullable=False),
    sa.Column('dtype', sa.String(length=16), nullable=False),
    sa.Column('fwd_s', sa.Float(), nullable=True),
    sa.Column('bwd_s', sa.Float(), nullable=True),
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('note', sa.Text(), nullable=True),
    sa.Column('n_rep', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('(CURRENT_TIMESTAMP)'), nullable=False),
    sa.CheckConstraint("status <> 'OK' OR fwd_s IS NOT NULL", name='fwd_s_present_when_ok'),
    sa.CheckConstraint("status IN ('OK', 'OOM', 'UNSUPPORTED', 'SKIP_MEM', 'SKIP_ALIGN', 'ERROR')", name='status_known'),
    sa.CheckConstraint('bwd_s IS NULL OR (bwd_s > 0 AND bwd_s < 1e300)', name='bwd_s_finite_positive'),
    sa.CheckConstraint('fwd_s IS NULL OR (fwd_s > 0 AND fwd_s < 1e300)', name='fwd_s_finite_positive'),
    sa.CheckConstraint('tokens > 0 AND hidden > 0', name='elementwise_dims_positive'),
    sa.ForeignKeyConstraint(['run_id'], ['bench_run.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('run_id', 'op', 'tokens', 'hidden', 'dtype')
    )
    with op.batch_alter_table('elementwise_point', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_elementwise_point_run_id'), ['run_id'], unique=False)

    op.create_table('gemm_point',
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('m', sa.Integer(), nullable=False),
    sa.Column('n', sa.Integer(), nullable=False),
    sa.Column('k', sa.Integer(), nullable=False),
    sa.Column('dtype', sa.String(length=16), nullable=False),
    sa.Column('t_s', sa.Float(), nullable=True),
    sa.Column('t_p10_s', sa.Float(), nullable=True),
    sa.Column('t_p90_s', sa.Float(), nullable=True),
    sa.Column('flops_per_s', sa.Float(), nullable=True),
    sa.Column('util', sa.Float(), nullable=True),
    sa.Column('backend', sa.String(length=64), nullable=True),
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('note', sa.Text(), nullable=True),
    sa.Column('n_rep', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('(CURRENT_TIMESTAMP)'), nullable=False),
    sa.CheckConstraint("status <> 'OK' OR t_s IS NOT NULL", name='t_s_present_when_ok'),
    sa.CheckConstraint("status IN ('OK', 'OOM', 'UNSUPPORTED', 'SKIP_MEM', 'SKIP_ALIGN', 'ERROR')", name='status_known'),
    sa.CheckConstraint('m > 0 AND n > 0 AND k > 0', name='gemm_dims_positive'),
    sa.CheckConstraint('t_p10_s IS NULL OR (t_p10_s > 0 AND t_p10_s < 1e300)', name='t_p10_s_finite_positive'),
    sa.CheckConstraint('t_p90_s IS NULL OR (t_p90_s > 0 AND t_p90_s < 1e300)', name='t_p90_s_finite_positive'),
    sa.CheckConstraint('t_s IS NULL OR (t_s > 0 AND t_s < 1e300)', name='t_s_finite_positive'),
    sa.ForeignKeyConstraint(['run_id'], ['bench_run.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('run_id', 'm', 'n', 'k', 'dtype')
    )
    with op.batch_alter_table('gemm_point', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_gemm_point_run_id'), ['run_id'], unique=False)

    op.create_table('grouped_gemm_point',
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('proj', sa.String(length=8), nullable=False),
    sa.Column('distribution', sa.String(length=16), nullable=False),
    sa.Column('num_gemms', sa.Integer(), nullable=False),
    sa.Column('tokens_per_expert', sa.Integer(), nullable=False),
    sa.Column('hidden', sa.Integer(), nullable=False),
    sa.Column('ffn', sa.Integer(), nullable=False),
    sa.Column('in_features', sa.Integer(), nullable=True),
    sa.Column('out_features', sa.Integer(), nullable=True),
    sa.Column('dtype', sa.String(length=16), nullable=False),
    sa.Column('fwd_s', sa.Float(), nullable=True),
    sa.Column('bwd_s', sa.Float(), nullable=True),
    sa.Column('fwd_p10_s', sa.Float(), nullable=True),
    sa.Column('fwd_p90_s', sa.Float(), nullable=True),
    sa.Column('impl', sa.String(length=64), nullable=True),
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('note', sa.Text(), nullable=True),
    sa.Column('n_rep', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('(CURRENT_TIMESTAMP)'), nullable=False),
    sa.CheckConstraint("status <> 'OK' OR fwd_s IS NOT NULL", name='fwd_s_present_when_ok'),
    sa.CheckConstraint("status IN ('OK', 'OOM', 'UNSUPPORTED', 'SKIP_MEM', 'SKIP_ALIGN', 'ERROR')", name='status_known'),
    sa.CheckConstraint('bwd_s IS NULL OR (bwd_s > 0 AND bwd_s < 1e300)', name='bwd_s_finite_positive'),
    sa.CheckConstraint('fwd_p10_s IS NULL OR (fwd_p10_s > 0 AND fwd_p10_s < 1e300)', name='fwd_p10_s_finite_positive'),
    sa.CheckConstraint('fwd_p90_s IS NULL OR (fwd_p90_s > 0 AND fwd_p90_s < 1e300)', name='fwd_p90_s_finite_positive'),
    sa.CheckConstraint('fwd_s IS NULL OR (fwd_s > 0 AND fwd_s < 1e300)', name='fwd_s_finite_positive'),
    sa.CheckConstraint('num_gemms > 0 AND tokens_per_expert > 0 AND hidden > 0 AND ffn > 0', name='grouped_dims_positive'),
    sa.ForeignKeyConstraint(['run_id'], ['bench_run.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('run_id', 'proj', 'distribution', 'num_gemms', 'tokens_per_expert', 'hidden', 'ffn', 'dtype')
    )
    with op.batch_alter_table('grouped_gemm_point', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_grouped_gemm_point_run_id'), ['run_id'], unique=False)

    op.create_table('router_point',
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('variant', sa.String(length=16), nullable=False),
    sa.Column('num_tokens', sa.Integer(), nullable=False),
    sa.Column('num_experts', sa.Integer(), nullable=False),
    sa.Column('k', sa.Integer(), nullable=False),
    sa.Column('hidden', sa.Integer(), nullable=False),
    sa.Column('dtype', sa.String(length=16), nullable=False),
    sa.Column('fwd_s', sa.Float(), nullable=True),
    sa.Column('bwd_s', sa.Float(), nullable=True),
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('note', sa.Text(), nullable=True),
    sa.Column('n_rep', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('(CURRENT_TIMESTAMP)'), nullable=False),
    sa.CheckConstraint("status <> 'OK' OR fwd_s IS NOT NULL", name='fwd_s_present_when_ok'),
    sa.CheckConstraint("status IN ('OK', 'OOM', 'UNSUPPORTED', 'SKIP_MEM', 'SKIP_ALIGN', 'ERROR')", name='status_known'),
    sa.CheckConstraint('bwd_s IS NULL OR (bwd_s > 0 AND bwd_s < 1e300)', name='bwd_s_finite_positive'),
    sa.CheckConstraint('fwd_s IS NULL OR (fwd_s > 0 AND fwd_s < 1e300)', name='fwd_s_finite_positive'),
    sa.CheckConstraint('num_tokens > 0 AND num_experts > 0 AND k > 0', name='router_dims_positive'),
    sa.ForeignKeyConstraint(['run_id'], ['bench_run.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('run_id', 'variant', 'num_tokens', 'num_experts', 'k', 'hidden', 'dtype')
    )
    with op.batch_alter_table('router_point', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_router_point_run_id'), ['run_id'], unique=False)

    op.create_table('sdpa_point',
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('seq_len', sa.Integer(), nullable=False),
    sa.Column('micro_bs', sa.Integer(), nullable=False),
    sa.Column('n_q_heads', sa.Integer(), nullable=False),
    sa.Column('n_kv_heads', sa.Integer(), nullable=False),
    sa.Column('head_dim', sa.Integer(), nullable=False),
    sa.Column('causal', sa.Boolean(), nullable=False),
    sa.Column('dtype', sa.String(length=16), nullable=False),
    sa.Column('backend', sa.String(length=32), nullable=False),
    sa.Column('fwd_s', sa.Float(), nullable=True),
    sa.Column('bwd_s', sa.Float(), nullable=True),
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('note', sa.Text(), nullable=True),
    sa.Column('n_rep', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('(CURRENT_TIMESTAMP)'), nullable=False),
    sa.CheckConstraint("status <> 'OK' OR fwd_s IS NOT NULL", name='fwd_s_present_when_ok'),
    sa.CheckConstraint("status IN ('OK', 'OOM', 'UNSUPPORTED', 'SKIP_MEM', 'SKIP_ALIGN', 'ERROR')", name='status_known'),
    sa.CheckConstraint('bwd_s IS NULL OR (bwd_s > 0 AND bwd_s < 1e300)', name='bwd_s_finite_positive'),
    sa.CheckConstraint('fwd_s IS NULL OR (fwd_s > 0 AND fwd_s < 1e300)', name='fwd_s_finite_positive'),
    sa.CheckConstraint('seq_len > 0 AND micro_bs > 0 AND n_q_heads > 0 AND n_kv_heads > 0 AND head_dim > 0', name='sdpa_dims_positive'),
    sa.ForeignKeyConstraint(['run_id'], ['bench_run.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('run_id', 'seq_len', 'micro_bs', 'n_q_heads', 'n_kv_heads', 'head_dim', 'causal', 'dtype', 'backend')
    )
    with op.batch_alter_table('sdpa_point', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_sdpa_point_run_id'), ['run_id'], unique=False)

    op.create_table('vocab_point',
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('op', sa.String(length=32), nullable=False),
    sa.Column('tokens', sa.Integer(), nullable=False),
    sa.Column('hidden', sa.Integer(), nullable=False),
    sa.Column('vocab', sa.Integer(), nullable=False),
    sa.Column('dtype', sa.String(length=16), nullable=False),
    sa.Column('fwd_s', sa.Float(), nullable=True),
    sa.Column('bwd_s', sa.Float(), nullable=True),
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('note', sa.Text(), nullable=True),
    sa.Column('n_rep', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), server_default=sa.text('(CURRENT_TIMESTAMP)'), nullable=False),
    sa.CheckConstraint("status <> 'OK' OR fwd_s IS NOT NULL", name='fwd_s_present_when_ok'),
    sa.CheckConstraint("status IN ('OK', 'OOM', 'UNSUPPORTED', 'SKIP_MEM', 'SKIP_ALIGN', 'ERROR')", name='status_known'),
    sa.CheckConstraint('bwd_s IS NULL OR (bwd_s > 0 AND bwd_s < 1e300)', name='bwd_s_finite_positive'),
    sa.CheckConstraint('fwd_s IS NULL OR (fwd_s > 0 AND fwd_s < 1e300)', name='fwd_s_finite_positive'),
    sa.CheckConstraint('tokens > 0 AND hidden > 0 AND vocab > 0', name='vocab_dims_positive'),
    sa.ForeignKeyConstraint(['run_id'], ['bench_run.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('run_id', 'op', 'tokens', 'hidden', 'vocab', 'dtype')
    )
    with op.batch_alter_table('vocab_point', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_vocab_point_run_id'), ['run_id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('vocab_point', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_vocab_point_run_id'))

    op.drop_table('vocab_point')
    with op.batch_alter_table('sdpa_point', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_sdpa_point_run_id'))

    op.drop_table('sdpa_point')
    with op.batch_alter_table('router_point', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_router_point_run_id'))

    op.drop_table('router_point')
    with op.batch_alter_table('grouped_gemm_point', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_grouped_gemm_point_run_id'))

    op.drop_table('grouped_gemm_point')
    with op.batch_alter_table('gemm_point', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_gemm_point_run_id'))

    op.drop_table('gemm_point')
    with op.batch_alter_table('elementwise_point', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_elementwise_point_run_id'))

    op.drop_table('elementwise_point')
    with op.batch_alter_table('dispatch_point', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_dispatch_point_run_id'))

    op.drop_table('dispatch_point')
    with op.batch_alter_table('collective_point', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_collective_point_run_id'))

    op.drop_table('collective_point')
    with op.batch_alter_table('observed_run', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_observed_run_sweep'))
        batch_op.drop_index(batch_op.f('ix_observed_run_profile'))

    op.drop_table('observed_run')
    op.drop_table('law_run')
    op.drop_table('law_fit')
    op.drop_table('hardware_profile')
    with op.batch_alter_table('calibration', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_calibration_profile'))

    op.drop_table('calibration')
    with op.batch_alter_table('bench_run', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_bench_run_suite'))
        batch_op.drop_index(batch_op.f('ix_bench_run_profile'))
        batch_op.drop_index(batch_op.f('ix_bench_run_config_hash'))

    op.drop_table('bench_run')
