"""Pure pieces of the bench package, checked against hand-derived values."""

from __future__ import annotations

import pytest
import torch
from scaleplan.bench import harness as h
from scaleplan.bench.suites import collectives as coll
from scaleplan.bench.suites import elementwise, grouped_gemm, router


def test_stats_percentiles_by_hand():
    st = h.Stats([float(x) for x in range(1, 11)])  # 1..10
    assert st.median == 5.5
    assert st.p10 == pytest.approx(1.9)  # linear interpolation: 1 + 0.1 * 9 * (2 - 1)
    assert st.p90 == pytest.approx(9.1)
    assert st.n == 10


@pytest.mark.parametrize(
    "exc,status",
    [
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"), "OOM"),
        (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 10 TB"), "OOM"),
        (h.Unsupported("tf32 is a tensor-core mode"), "UNSUPPORTED"),
        (NotImplementedError("no kernel"), "UNSUPPORTED"),
        (RuntimeError("No viable backend for scaled_dot_product_attention was found."), "UNSUPPORTED"),
        (h.SkipMem("too big"), "SKIP_MEM"),
        (h.SkipAlign("K % 16"), "SKIP_ALIGN"),
        (ValueError("something else"), "ERROR"),
    ],
)
def test_classify_error(exc, status):
    st, note = h.classify_error(exc)
    assert st == status
    assert note and "\n" not in note


def test_bus_factors_are_nccl_tests():
    assert coll.bus_factor("all_reduce", 8) == pytest.approx(2 * 7 / 8)
    for c in ("reduce_scatter", "all_gather", "all_to_all"):
        assert coll.bus_factor(c, 8) == pytest.approx(7 / 8)
    assert coll.bus_factor("send_recv", 8) == 1.0
    with pytest.raises(ValueError):
        coll.bus_factor("broadcast", 8)


def test_groups_and_node_spanning():
    assert coll.groups(16, 4, "contiguous")[1] == [4, 5, 6, 7]
    assert coll.groups(16, 4, "strided")[1] == [1, 5, 9, 13]
    for layout in ("contiguous", "strided"):  # a partition of all ranks
        gs = coll.groups(16, 4, layout)
        assert sorted(r for g in gs for r in g) == list(range(16))
    # two nodes of 8: contiguous groups up to 8 stay in a node, strided ones cross it
    assert not coll.is_inter_node(coll.groups(16, 8, "contiguous")[0], 8)
    assert coll.is_inter_node(coll.groups(16, 16, "contiguous")[0], 8)
    assert coll.is_inter_node(coll.groups(16, 2, "strided")[0], 8)  # ranks 0 and 8
    assert not coll.is_inter_node(coll.groups(16, 2, "strided")[0], 16)


def test_expand_collectives_world_16():
    cfg = coll.Config(
        dtypes=["bf16"], collectives=["all_reduce"], sizes_bytes=[1 << 20], layouts=["contiguous", "strided"]
    )
    pts, skipped = coll.expand_for(cfg, 16, 8)
    keys = {(p["group_size"], p["layout"], p["inter_node"]) for p in pts}
    # strided is skipped only where it equals contiguous (n == world)
    assert keys == {
        (2, "contiguous", False),
        (4, "contiguous", False),
        (8, "contiguous", False),
        (16, "contiguous", True),
        (2, "strided", True),
        (4, "strided", True),
        (8, "strided", True),
    }
    assert skipped == 0


def test_round_size():
    assert coll.round_size(1000, "all_gather", 3, "bf16") == 996  # multiple of 3 elements of 2 bytes
    assert coll.round_size(1001, "all_reduce", 3, "bf16") == 1000
    explicit = coll.Config(
        points=[
            {
                "collective": "all_gather",
                "group_size": 2,
                "layout": "contiguous",
                "inter_node": False,
                "size_bytes": 10,
                "dtype": "fp32",
            },
            {
                "collective": "all_gather",
                "group_size": 4,
                "layout": "contiguous",
                "inter_node": False,
                "size_bytes": 64,
                "dtype": "fp32",
            },
        ]
    )
    pts, skipped = coll.expand_for(explicit, 2, 2)
    assert [p["size_bytes"] for p in pts] == [8] and skipped == 1  # group of 4 needs 4 ranks


@pytest.mark.parametrize("n,t", [(1, 7), (4, 3), (8, 512), (128, 64)])
def test_grouped_splits(n, t):
    bal = grouped_gemm.splits(n, t, "balanced")
    sk = grouped_gemm.splits(n, t, "skewed")
    assert sum(bal) == sum(sk) == n * t and len(sk) == n
    assert min(sk) >= 1 and sk == sorted(sk, reverse=True)
    if n > 1:
        assert sk[0] > t  # the head expert is overloaded


def test_grouped_features():
    assert grouped_gemm.features("fc1", 1024, 1280) == (1024, 2560)  # GLU: gate and up in one GEMM
    assert grouped_gemm.features("fc2", 1024, 1280) == (1280, 1024)


def test_gumbel_route_invariants_and_limit():
    torch.manual_seed(0)
    t, d, e, k = 64, 16, 8, 2
    hs, w = torch.randn(t, d), torch.randn(e, d)
    phi = torch.zeros(e)
    top, gates, counts = router.gumbel_route(hs, w, phi, k, tau=0.5, rho=2, c_r=1.0)
    assert top.shape == (t, k) and gates.shape == (t, k)
    assert torch.allclose(gates.sum(-1), torch.ones(t))
    assert all(len(set(row.tolist())) == k for row in top)
    assert int(counts.sum()) == t * k
    # with no noise and a proposal of every expert, it is plain top-k of the sigmoid scores
    top0, gates0, _ = router.gumbel_route(hs, w, phi, k, tau=0.0, rho=e, c_r=1.0)
    w_n = w / w.norm(dim=1, keepdim=True)
    ref = torch.topk(torch.sigmoid(hs @ w_n.t()), k, dim=-1)
    assert torch.equal(top0.sort(-1).values, ref.indices.sort(-1).values)
    assert torch.allclose(gates0.sum(-1), torch.ones(t))


def test_rope_is_a_complex_rotation():
    torch.manual_seed(0)
    t, hd = 5, 8
    x = torch.randn(t, 1, hd)
    ang = torch.rand(t, 1, hd // 2) * 6
    out = elementwise.rope(x, torch.cat((ang, ang), -1).cos(), torch.cat((ang, ang), -1).sin())
    z = torch.complex(x[..., : hd // 2], x[..., hd // 2 :]) * torch.exp(1j * ang)
    assert torch.allclose(out, torch.cat((z.real, z.imag), -1), atol=1e-6)


def test_nvml_snapshot_degrades_without_gpu():
    from scaleplan.bench.provenance import git_rev, nvml_snapshot

    snap = nvml_snapshot(0)
    if "error" not in snap:
        pytest.skip("a GPU with NVML is present")
    assert isinstance(snap["error"], str)
    rev = git_rev()
    assert rev is None or len(rev.split("+")[0]) == 40


def test_git_rev_outside_a_checkout_reads_the_environment(tmp_path, monkeypatch):
    """A copy of the tree without .git (shipped to a GPU host) is named by $SCALEPLAN_GIT_REV."""
    from scaleplan.bench.provenance import git_rev

    monkeypatch.delenv("SCALEPLAN_GIT_REV", raising=False)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))  # no repo above tmp_path either
    assert git_rev(tmp_path) is None
    monkeypatch.setenv("SCALEPLAN_GIT_REV", "0123abc")
    assert git_rev(tmp_path) == "0123abc"


def test_timing_check_reports_consistent_rates():
    from scaleplan.bench.checks import gemm_timing_check

    res = gemm_timing_check(torch.device("cpu"), n=64, dtype="fp32")
    assert res["harness_flops_per_s"] == pytest.approx(2 * 64**3 / res["harness_t_s"])
    assert res["ratio"] == pytest.approx(res["harness_flops_per_s"] / res["plain_flops_per_s"])
    assert res["passed"] == (res["ratio"] >= 0.9)


def test_tf32_mode_sets_and_restores_the_cublas_knob():
    knob = torch.backends.cuda.matmul
    if not hasattr(knob, "fp32_precision"):
        pytest.skip("older torch: allow_tf32 API")
    before = knob.fp32_precision
    with h.tf32_mode("tf32"):
        assert knob.fp32_precision == "tf32"
    with h.tf32_mode("fp32"):
        assert knob.fp32_precision == "ieee"  # fp32 means no TF32 shortcut
    assert knob.fp32_precision == before


def test_nvml_index_follows_cuda_visible_devices(monkeypatch):
    from scaleplan.bench.provenance import _nvml_index

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert (_nvml_index(0), _nvml_index(1)) == (3, 5)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-0a1b")  # UUIDs: NVML order is used as is
    assert _nvml_index(0) == 0


@pytest.mark.parametrize(
    "name,count,profile",
    [
        ("NVIDIA H200", 1, "h200-single"),
        ("NVIDIA H200", 8, "p5en.48xlarge"),
        ("NVIDIA B200", 8, "p6-b200.48xlarge"),
        ("NVIDIA B300 SXM6 AC", 8, "p6-b300.48xlarge"),
        ("NVIDIA GB300", 4, "p6e-gb300.36xlarge"),
        ("NVIDIA H100 80GB HBM3", 8, "p5.48xlarge"),
        ("NVIDIA H100 80GB HBM3", 1, "h100-single"),
        ("NVIDIA A100-SXM4-40GB", 8, "p4d.24xlarge"),
    ],
)
def test_default_profile_from_gpu_name(monkeypatch, name, count, profile):
    from scaleplan.bench import runner

    from scaleplan.profiles import profile_names

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: name)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    assert runner.default_profile(torch.device("cuda", 0)) == profile and profile in profile_names()


def test_unknown_gpu_asks_for_a_profile(monkeypatch):
    from scaleplan.bench import runner

    from scaleplan.errors import ScaleplanError

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Some Future GPU")
    with pytest.raises(ScaleplanError, match="--profile"):
        runner.default_profile(torch.device("cuda", 0))
    assert runner.default_profile(torch.device("cpu")) == "cpu-local"


@pytest.mark.parametrize("name", ["quick", "node", "single-gpu", "single-gpu-holdout", "single-gpu-fp8"])
def test_builtin_presets_validate_and_expand(name):
    """Every suite block of a shipped preset passes its Config (unknown keys are errors) and expands to
    the cartesian product of its axes; single-gpu leaves out collectives (one GPU has no peer)."""
    from math import prod

    from scaleplan.bench.config import load_preset, preset_names, validate_suite_config
    from scaleplan.bench.suites import get_suite

    assert name in preset_names()
    p = load_preset(name)
    ctx = h.Context(device=torch.device("cpu"), timing=h.Timing())
    for suite, block in p.suites.items():
        mod = get_suite(suite)
        pts = mod.expand(validate_suite_config(suite, mod.Config, block), ctx)
        if suite == "gemm":
            assert len(pts) == prod(len(block[a]) for a in ("m", "n", "k", "dtypes"))
        assert pts, suite
    if name == "single-gpu":
        assert "collectives" not in p.suites and len(p.suites) == 8
