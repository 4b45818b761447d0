"""The precedence of the dispatch law's sources (estimator.dispatch.law_in_force): defaults < the profile's
block < the measured dispatch rows < a 'dispatch' calibration row, which also carries the runtime scales."""
from types import SimpleNamespace

from scaleplan.estimator.dispatch import (
    KAPPA0_DEFAULT,
    T_GAP_DEFAULT_S,
    T_HOST_DEFAULT_S,
    law_in_force,
)

from scaleplan.profiles import DispatchDefaults

BLOCK = DispatchDefaults(kappa0=600.0, kappa1=7.0, t_gap_s=27e-6, t_host_s=1e-3, t_ep_host_s=2e-4, source="traces")


def test_defaults_without_any_source():
    law, scales = law_in_force(None, None, None)
    assert (law.kappa0, law.t_gap_s, law.t_host_s, law.source) == (KAPPA0_DEFAULT, T_GAP_DEFAULT_S,
                                                                    T_HOST_DEFAULT_S, "default")
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
