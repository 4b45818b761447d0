"""estimator/dispatch.py: the CPU dispatch law t_disp = L_stage kappa(E_loc) t_gap + n_moe [EP>1] t_ep_host
+ t_host per micro-batch (sec:iteration-time-model), and the precedence of its sources (law_in_force):
defaults < the profile's block < the measured dispatch rows < a 'dispatch' calibration row, which also
carries the runtime scales."""
from types import SimpleNamespace

import numpy as np
import pytest
from scaleplan.estimator.ckpt import CkptMode
from scaleplan.estimator.dispatch import DispatchLaw, dispatch_time, law_in_force, lent_host_ratio

from scaleplan.profiles import DispatchDefaults

BLOCK = DispatchDefaults(kappa0=600.0, kappa1=7.0, t_gap_s=27e-6, t_host_s=1e-3, t_ep_host_s=2e-4, source="traces")


def test_defaults_without_any_source():
    """With no profile block, table or calibration: the kernel counts that the reference estimator's profiler
    traces of the Megatron-Core MoE stack give (dmlc/ScalePlan dlcalc/utils/kernel_launch.py: ~759 kernels per
    layer and micro-batch at 16 local experts, ~1576 at 128), no fixed host time, and every scale at 1."""
    law, scales = law_in_force(None, None, None)
    assert law.kappa(16) == pytest.approx(759, abs=1) and law.kappa(128) == pytest.approx(1576, abs=1)
    assert (law.t_host_s, law.source) == (0.0, "default") and 0 < law.t_gap_s < 1e-4
    assert scales == {"host_scale": 1.0, "kernel_scale": 1.0, "ep_host_scale": 1.0}


def test_measured_chain_gap_only_where_the_profile_has_no_block():
    law, _ = law_in_force(None, 40e-6, 2e-3)
    assert (law.t_gap_s, law.t_host_s, law.source) == (40e-6, 2e-3, "dispatch table")
    law, _ = law_in_force(BLOCK, 40e-6, 2e-3)  # the block's gap stays; the measured t_host replaces its own
    assert (law.t_gap_s, law.t_host_s, law.t_ep_host_s) == (27e-6, 2e-3, 2e-4)
    assert law.source == "profile (traces)"


def test_calibration_row_overrides_what_it_carries_and_sets_the_scales():
    row = SimpleNamespace(id=7, coefficients={"t_gap_s": 30e-6, "host_scale": 1.5, "kernel_scale": 0.8})
    law, scales = law_in_force(BLOCK, 40e-6, None, row)
    assert (law.t_gap_s, law.kappa0, law.kappa1, law.t_host_s) == (30e-6, 600.0, 7.0, 1e-3)
    assert law.source == "calibration 7"
    assert scales == {"host_scale": 1.5, "kernel_scale": 0.8, "ep_host_scale": 1.0}


def test_dispatch_law_charges_the_ep_host_term_per_moe_layer_only_under_ep():
    law = DispatchLaw(kappa0=600.0, kappa1=5.0, t_gap_s=20e-6, t_host_s=10e-3, t_ep_host_s=2e-3)
    full = np.array(CkptMode.FULL.value)
    # 4 MoE layers, EP=8 (16 local experts): 4 (600 + 80) 20 us + 4 x 2 ms + 10 ms
    t8 = dispatch_time(law, 4, 16, full, 4, np.array(8))
    assert float(t8) == pytest.approx(4 * 680 * 20e-6 + 8e-3 + 10e-3)
    # EP=1 (128 local experts): no EP host term: 4 (600 + 640) 20 us + 10 ms
    t1 = dispatch_time(law, 4, 128, full, 4, np.array(1))
    assert float(t1) == pytest.approx(4 * 1240 * 20e-6 + 10e-3)


def test_dispatch_law_counts_kernels_in_the_checkpoint_modes_units():
    """kappa is counted in full-recompute units (forward 1 + backward 2 + recompute 1 = 4): without
    recompute a layer launches 3/4 of those kernels, selective 3.1/4, super-selective 3.3/4."""
    law = DispatchLaw(kappa0=600.0, kappa1=5.0, t_gap_s=20e-6, t_host_s=0.0, t_ep_host_s=1e-3)
    full = 2 * (600 + 5 * 8) * 20e-6 + 2 * 1e-3  # 2 MoE layers, 8 local experts, EP 4
    for mode, units in ((CkptMode.NONE, 3.0), (CkptMode.SELECTIVE, 3.1), (CkptMode.SUPER_SELECTIVE, 3.3),
                        (CkptMode.FULL, 4.0)):
        t = dispatch_time(law, 2, 8, np.array(mode.value), 2, np.array(4))
        assert float(t) == pytest.approx(full * units / 4), mode


def test_each_dispatcher_pays_the_host_path_its_code_runs():
    """The law's t_ep_host was read from traces of the all-to-all dispatcher's Python path; the fused dispatchers
    and the all-gather one keep only their host syncs on the forward's token counts (DeepEP's spin on the
    received count, HybridEP's stream sync before its permute, the all-gather's .cpu()), one launch gap each,
    twice where the MoE forward runs again; HybridEP sized on the host (drop-and-pad) syncs not at all."""
    from scaleplan.estimator.dispatch import ep_host_time

    law = DispatchLaw(kappa0=600.0, kappa1=5.0, t_gap_s=20e-6, t_host_s=0.0, t_ep_host_s=1e-2)
    units, once, twice = np.array([0.75, 1.0]), np.array([1.0, 1.0]), np.array([1.0, 2.0])
    np.testing.assert_allclose(ep_host_time(law, "alltoall", "alltoall", units, once), [7.5e-3, 1e-2])
    for d in ("deepep", "hybridep", "allgather"):
        np.testing.assert_allclose(ep_host_time(law, "alltoall", d, units, once), [20e-6, 20e-6])
        np.testing.assert_allclose(ep_host_time(law, "alltoall", d, units, twice), [20e-6, 40e-6])
    np.testing.assert_allclose(ep_host_time(law, "alltoall", "hybridep", units, once, drop_pad=True), [0.0, 0.0])
    # a law traced on a fused dispatcher says nothing of the all-to-all's path: its own term stays
    np.testing.assert_allclose(ep_host_time(law, "deepep", "alltoall", units, once), [7.5e-3, 1e-2])
    # stock Megatron-Core's all-to-all path is kernels and one sync on the split sizes, not the paper's residual
    np.testing.assert_allclose(ep_host_time(law, "alltoall", "alltoall", units, twice, stock=True), [20e-6, 40e-6])
    np.testing.assert_allclose(ep_host_time(law, "deepep", "alltoall", units, once, stock=True), [7.5e-3, 1e-2])
    # in the law: 2 MoE layers under EP, the EP term replaced by the dispatcher's
    t = dispatch_time(law, 2, 8, np.array(CkptMode.FULL.value), 2, np.array(4), ep_host_s=np.array(20e-6))
    assert float(t) == pytest.approx(2 * (600 + 40) * 20e-6 + 2 * 20e-6)


def test_a_lent_law_takes_this_hosts_launch_speed_where_both_hosts_are_measured():
    """A law traced on another host (a profile's dispatch_from) times this host's measured chain gap over the
    lender's: every host term scales by it, the kernel counts do not, a measured t_host still replaces; without
    both gaps measured there is no ratio and the law stays the lender's."""
    law, _ = law_in_force(BLOCK, None, None, None, host_ratio=1.5)
    host = (BLOCK.t_gap_s, BLOCK.t_host_s, BLOCK.t_ep_host_s)
    assert (law.t_gap_s, law.t_host_s, law.t_ep_host_s) == pytest.approx(tuple(1.5 * x for x in host))
    assert (law.kappa0, law.kappa1) == (BLOCK.kappa0, BLOCK.kappa1) and "x 1.50" in law.source
    law, _ = law_in_force(BLOCK, 30e-6, 4e-3, None, host_ratio=1.5)
    assert (law.t_gap_s, law.t_host_s) == pytest.approx((1.5 * BLOCK.t_gap_s, 4e-3))
    assert lent_host_ratio(30e-6, 20e-6) == pytest.approx(1.5)
    assert lent_host_ratio(None, 20e-6) is None and lent_host_ratio(30e-6, None) is None
