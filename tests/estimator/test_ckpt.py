"""estimator/ckpt.py: the checkpointing modes and what each re-runs in the backward (module docstring:
none keeps everything; selective re-runs SDPA; super-selective also the element-wise work; full the
whole block)."""
import numpy as np
import pytest
from scaleplan.estimator.ckpt import (
    CkptMode,
    codes,
    kernel_units,
    recomputes_block,
    recomputes_pointwise,
    recomputes_sdpa,
)

from scaleplan.errors import SpecError

ALL = ["none", "selective", "super-selective", "full"]


def test_spec_names_round_trip_and_unknown_names_are_refused():
    for name in ALL:
        assert CkptMode.parse(name).spec_name == name
    assert list(codes(ALL)) == [0, 1, 2, 3]
    with pytest.raises(SpecError, match="ckpt"):
        CkptMode.parse("partial")


def test_what_each_mode_recomputes():
    c = codes(ALL)
    assert list(recomputes_sdpa(c)) == [0, 1, 1, 1]
    assert list(recomputes_pointwise(c)) == [0, 0, 1, 1]
    assert list(recomputes_block(c)) == [0, 0, 0, 1]


def test_kernel_units_forward_backward_and_recompute():
    # forward 1 + backward 2 = 3; full re-runs the forward: 4; selective / super-selective in between
    assert kernel_units(codes(ALL)) == pytest.approx([3.0, 3.1, 3.3, 4.0])
    assert kernel_units(np.array([[3, 0]])).shape == (1, 2)  # arrays of plans keep their shape


def test_recompute_hands_each_plan_its_modes_row():
    """recompute reads a per-mode table: every field equals the direct elementwise count of the same codes
    (with and without a stack's modules, for arrays and one code), and an array asked again gets the same
    answer without recounting."""
    from scaleplan.estimator.ckpt import Recompute, _recompute, recompute

    rng = np.random.default_rng(3)
    codes = rng.integers(0, 4, 1000)
    for mods in (None, ("core_attn", "moe_act", "layernorm"), ("moe", "mlp", "shared_experts", "mla_up_proj")):
        got, want = recompute(codes, mods), _recompute(codes, mods)
        for f in Recompute.__dataclass_fields__:
            assert np.array_equal(getattr(got, f), getattr(want, f)), (mods, f)
            assert not getattr(got, f).flags.writeable
        assert recompute(codes, mods) is got
        one = recompute(2, mods)
        assert all(float(getattr(one, f)) == getattr(want, f)[np.argmax(codes == 2)] for f in Recompute.__dataclass_fields__)
