"""A calibration belongs to the training stack its runs ran (scaleplan/stack.py) and is never in force for
another: the rows' stack column, the query of the rows in force, and the fits' choice of runs."""
from __future__ import annotations

import pytest

from scaleplan.db import calibrations as store
from scaleplan.db import session as dbs
from scaleplan.errors import ScaleplanError, SpecError
from scaleplan.stack import Stack, spec_stack_key, stack_from_key

MXFP8 = Stack(fp8_recipe="mxfp8").key("fp8")
P = "p6-b200.48xlarge"


def _store(url, kind, co, stack=store.PAPER_STACK_KEY):
    with dbs.session_scope(url) as s:
        return store.store_calibration(s, P, kind, co, inputs={}, residuals=[], cv_error=None, n_obs=1, notes="",
                                       stack=stack).id


def test_a_calibration_is_in_force_for_its_own_stack_only(sqlite_url):
    paper = _store(sqlite_url, "chi_sys", {"c_a2a": 0.1})
    fp8 = _store(sqlite_url, "chi_sys", {"c_a2a": 0.9}, MXFP8)  # the newest version, but of another stack
    assert store.calibrations_in_force(sqlite_url, P)["chi_sys"].id == paper
    got = store.calibrations_in_force(sqlite_url, P, stack=MXFP8)["chi_sys"]
    assert got.id == fp8 and got.stack == MXFP8
    assert store.calibrations_in_force(sqlite_url, P, stack=Stack(dispatcher="deepep").key()) == {}
    with pytest.raises(SpecError) as e:  # chosen by id for a plan of the other stack
        store.calibrations_in_force(sqlite_url, P, cal_id=fp8)
    assert "stack megatron" in str(e.value) and "\n" not in str(e.value)


def test_rows_stored_before_the_stack_column_belong_to_the_papers_stack(sqlite_url):
    import sqlalchemy as sa

    old = _store(sqlite_url, "dispatch", {"t_gap_s": 2e-5})
    with dbs.get_engine(sqlite_url).begin() as c:  # what migration 0006 leaves on an earlier row
        c.execute(sa.text("UPDATE calibration SET stack = NULL WHERE id = :i"), {"i": old})
    assert store.calibrations_in_force(sqlite_url, P)["dispatch"].stack == store.PAPER_STACK_KEY
    assert "dispatch" not in store.calibrations_in_force(sqlite_url, P, stack=MXFP8)
    with dbs.session_scope(sqlite_url) as s:
        assert store.newest(s, P, "dispatch").id == old and store.newest(s, P, "dispatch", MXFP8) is None


def test_the_fits_take_the_runs_of_one_stack(sqlite_url):
    from scaleplan.calibrate.observations import Observation, store_observations
    from scaleplan.calibrate.runner import _observations

    model = {"n_layers": 4, "hidden_sz": 1024, "inter_sz": 2048, "n_q_heads": 8, "n_kv_heads": 8, "head_dim": 128,
             "vocab_sz": 32000, "precision": "fp8"}
    runs = [Observation(sweep=f"s{i}", model_name=None, spec={"model": model, **extra}, profile=P, n_devices=8,
                        gbs=64, seqlen=2048, layout={"tp": 1, "cp": 1, "pp": 1, "dp": 8, "ep": 1, "etp": 1, "vpp": 1, "mbs": 1,
                                "ckpt": "none"},
                        measured_t_iter_s=1.0 + i)
            for i, extra in enumerate(({}, {"stack": {"fp8_recipe": "mxfp8"}}, {"stack": {"fp8_recipe": "mxfp8"}}))]
    with dbs.session_scope(sqlite_url) as s:
        store_observations(s, runs)
    assert [o.sweep for o in _observations(sqlite_url, P, stack=Stack().key("fp8"))] == ["s0"]
    assert sorted(o.sweep for o in _observations(sqlite_url, P, stack=MXFP8)) == ["s1", "s2"]
    with pytest.raises(ScaleplanError) as e:
        _observations(sqlite_url, P, stack=Stack(grouped_gemm="grouped").key("fp8"))
    assert "pass --stack" in str(e.value) and MXFP8 in str(e.value)


def test_a_stack_key_names_its_stack_and_a_bad_key_is_one_line():
    for st, prec in ((Stack(), "bf16"), (Stack(), "fp8"),
                     (Stack(fp8_recipe="mxfp8", cuda_graphs=("attn", "moe_router")), "fp8"),
                     (Stack(permute_fusion=True, dispatcher="hybridep"), "bf16")):
        assert stack_from_key(st.key(prec)).key(prec) == st.key(prec)
    assert spec_stack_key({"model": {"precision": "fp8"}, "stack": {"fp8_recipe": "tensorwise"}}) == \
        spec_stack_key({"model": {"precision": "fp8"}}) == "megatron[fp8_recipe=tensorwise]"
    assert spec_stack_key({"model": {"precision": "bf16"}}) == "megatron"
    for bad in ("paper", "megatron[fp8_recipe=mxfp9]", "megatron[nope=1]"):
        with pytest.raises(SpecError) as e:
            stack_from_key(bad)
        assert e.value.field.startswith("--stack") and "\n" not in str(e.value)
