"""Geometry ladder (sec:geometry-ladder) against the paper's printed tables."""
import itertools

import pytest
from paper_tables import RESULT_ROWS, SCALE_LADDER

from scaleplan.geometry import ladder_model, spec_param_counts
from scaleplan.mosaic.ladder import LadderGrid, enumerate_geometries


def _grid_row(q, e, k, g):
    df = enumerate_geometries(LadderGrid(q=(q,), experts=(e,), topk=(k,), g=(g,), s_min=0.0))
    assert len(df) == 1
    return df.iloc[0]


@pytest.mark.parametrize("q,L,nh,d,dff,ntot,nact,s", SCALE_LADDER)
def test_scale_ladder_table(q, L, nh, d, dff, ntot, nact, s):
    r = _grid_row(q, 128, 3, 4)
    m = ladder_model(q, 128, 3, 4)
    assert (r.n_layers, m.n_q_heads, r.d, r.d_ff) == (L, nh, d, dff)
    assert r.d_expert == dff // 4
    # printed to 0.1 B and 3 decimals: half a unit of the last digit; the paper's two largest rungs sit a
    # little below our counts (N_tot 1472.8 vs 1472.95 B, N_act 59.5 vs 59.59 B), so allow 1.5e-4 relative on
    # N_tot and 2e-3 relative on N_act there
    assert abs(r.n_tot / 1e9 - ntot) <= max(0.05, 1.5e-4 * ntot)
    assert abs(r.n_act / 1e9 - nact) <= max(0.05, 2e-3 * nact)
    assert abs(r.s - s) <= 0.0006


@pytest.mark.parametrize("q,e,k,g,nact,ntot,s", RESULT_ROWS)
def test_result_table_columns(q, e, k, g, nact, ntot, s):
    r = _grid_row(q, e, k, g)
    assert abs(r.n_act / 1e9 - nact) <= 0.05 + 1e-9
    if ntot is not None:
        assert abs(r.n_tot / 1e9 - ntot) <= 0.05 + 1e-9
    assert abs(r.s - s) <= 0.0005 + 1e-9


def test_enumeration_matches_one_by_one_construction():
    grid = LadderGrid(q=(8, 12), experts=(4, 8, 96, 512), topk=(1, 2, 8), g=(1, 3, 4, 8), s_min=0.7)
    df = enumerate_geometries(grid)
    expect = set()
    for q, e, k, g in itertools.product(grid.q, grid.experts, grid.topk, grid.g):
        if k > e:
            continue
        try:
            m = ladder_model(q, e, k, g)
        except ValueError:  # d_ff not divisible by G (G=3 for d_ff=10240)
            continue
        if spec_param_counts(m).s >= 0.7:
            expect.add((q, e, k, g))
    got = set(map(tuple, df[["q", "n_experts", "topk", "g"]].to_numpy().tolist()))
    assert got == expect
    assert 10240 % 3 and not any(g == 3 and q == 8 for q, _, _, g in got)
    assert (df.s >= 0.7).all() and (df.topk <= df.n_experts).all()


def test_vocab_and_kv_heads_flags_change_counts_consistently():
    base = _grid_row(8, 32, 2, 2)
    df = enumerate_geometries(LadderGrid(q=(8,), experts=(32,), topk=(2,), g=(2,), s_min=0, vocab=32000, kv_heads=4))
    r = df.iloc[0]
    assert r.n_embed == 2 * 32000 * 4096          # untied input embedding + LM head
    # 4 fewer KV heads of 128 wide per layer for K and V: 2 * d * 4 * 128 per layer, 32 layers
    assert base.n_tot - r.n_tot == 32 * 2 * 4096 * 4 * 128
