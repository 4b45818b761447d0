"""The NVLink domain comes from the profile (ClusterProfile.scaleup_domain), not from the node: on a GB200
NVL72 (4-GPU trays, 72 GPUs per NVLink domain) an expert group inside one rack stays on NVLink, and one that
straddles two racks leaves it."""
from __future__ import annotations

import math

import pytest
from scaleplan.estimator import Estimator

from scaleplan.profiles import load_profile, profile_file
from scaleplan.specs import Layout, parse_spec

GB200 = load_profile("p6e-gb200.36xlarge")
TRAYS_ONLY = GB200.model_copy(update={"scaleup_gpus": None, "name": "gb200-trays-only"})  # NVLink = the tray


def _spec():
    # 128 experts: every EP below divides them; 4 layers, small widths: only the placement matters here
    return parse_spec({"model": {"n_layers": 4, "hidden_sz": 1024, "inter_sz": 2048, "n_q_heads": 8,
                                 "n_kv_heads": 8, "head_dim": 128, "vocab_sz": 32768,
                                 "moe": {"n_experts": 128, "experts_per_token": 2, "expert_inter_sz": 512}},
                       "data": {"gbs": 256, "seqlen": 2048, "microbatch_sz": 1},
                       "hardware": {"node_type": "p6e-gb200.36xlarge"}})


def _estimate(profile, n_devices: int, ep: int):
    est = Estimator(profile, tables=Estimator(profile_file("p6e-gb200.36xlarge"), db_url="sqlite://").tables,
                    use_calibration=False)
    return est.estimate(_spec(), n_devices, [Layout(dp=n_devices, ep=ep, mbs=1, ckpt="none")])[0]


def test_gb200_profile_reads_as_its_datasheet():
    assert (GB200.gpus_per_node, GB200.scaleup_domain) == (4, 72)
    # NVL72 datasheet: 360 PFLOPS bf16 with sparsity over 72 GPUs -> dense per GPU
    assert GB200.peak("bf16") == pytest.approx(360e15 / 72 / 2)
    for name in ("p5.48xlarge", "p5en.48xlarge", "p6-b200.48xlarge"):  # an 8-GPU node is its own NVLink domain
        p = load_profile(name)
        assert p.scaleup_domain == p.gpus_per_node == 8


@pytest.mark.parametrize("n_dev, ep", [(64, 64), (128, 8), (64, 32)])
def test_expert_group_inside_the_nvlink_domain(n_dev, ep):
    """EP ranks are contiguous (ETP = 1): every group of ep ranks lies inside one 72-GPU rack here (64 GPUs: one
    rack; EP 8 on 128: 72 / 8 = 9 groups fill rack 0 exactly), where the trays alone would span ep / 4 nodes."""
    nvl = _estimate(GB200, n_dev, ep)
    trays = _estimate(TRAYS_ONLY, n_dev, ep)
    assert nvl.chi_inputs["ep_nodes"] == 1
    assert trays.chi_inputs["ep_nodes"] == ep // 4
    # the same all-to-all bytes over NVLink (900 GB/s per direction) instead of the NIC (50 GB/s): faster
    assert nvl.breakdown_s["ep_a2a"] < trays.breakdown_s["ep_a2a"]


PACKED = GB200.model_copy(update={"scaleup_fill": "packed", "name": "gb200-packed"})  # 72 ranks to a rack


def test_expert_group_across_a_rack_boundary_leaves_it():
    """Packed, ranks fill the racks in order, 72 to a rack. EP 64 on 128 GPUs: the group of ranks 64-127 has 8 ranks
    in rack 0 and 56 in rack 1, so the step's all-to-all crosses the NICs (those 8 ranks send 56/64 of their bytes
    over them), slower than on a rack that held all 128 GPUs; EP 128 on 256: ranks 128-255 span racks 1-3."""
    assert _estimate(PACKED, 128, 64).chi_inputs["ep_nodes"] == 2
    whole = PACKED.model_copy(update={"scaleup_gpus": 128, "name": "gb200-one-128-gpu-domain"})
    assert _estimate(whole, 128, 64).chi_inputs["ep_nodes"] == 1
    assert _estimate(PACKED, 128, 64).breakdown_s["ep_a2a"] > _estimate(whole, 128, 64).breakdown_s["ep_a2a"]
    assert _estimate(PACKED, 256, 128).chi_inputs["ep_nodes"] == 3


@pytest.mark.parametrize("n_dev, trays", [
    (8, 2), (64, 16), (72, 18),  # a job one rack holds: all its trays in one domain
    (128, 16), (256, 16),        # 32 and 64 trays: 16 is their largest divisor of at most 18
    (144, 18), (96, 12), (76, 1),  # 36 trays: 18; 24: 12; 19 (prime, above 18): one tray per domain
])
def test_a_job_takes_its_domains_as_slurm_segments(n_dev, trays):
    """The segment rule by hand (Megatron-Bridge's GB200 launcher: --segment is the node count up to a rack's 18
    trays, else the count's largest divisor up to 18); packed, every job sees the 72-GPU rack."""
    assert GB200.job_domain(n_dev) == 4 * trays
    assert PACKED.job_domain(n_dev) == 72
    assert load_profile("p6-b200.48xlarge").job_domain(n_dev) == 8  # a node-sized domain is the node


def test_segments_keep_power_of_two_expert_groups_inside_a_rack():
    """256 GB200 under --segment: 64 GPUs in each of 4 racks, so EP 64 (ranks 64 j .. 64 j + 63) never leaves its
    rack, while packed 72 to a rack its second group straddles racks 0 and 1; EP 128 spans two 64-GPU domains."""
    seg, packed = _estimate(GB200, 256, 64), _estimate(PACKED, 256, 64)
    assert (seg.chi_inputs["ep_nodes"], packed.chi_inputs["ep_nodes"]) == (1, 2)
    assert seg.breakdown_s["ep_a2a"] < packed.breakdown_s["ep_a2a"]
    assert _estimate(GB200, 256, 128).chi_inputs["ep_nodes"] == 2
