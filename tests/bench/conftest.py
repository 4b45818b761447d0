"""Fixtures for the bench tests: tiny presets that run in seconds on a 2-core CPU."""

from __future__ import annotations

import pytest

FAST_TIMING = {"warmup": 1, "reps": 3, "min_reps": 2, "max_time_s": 0.05}

TINY_SUITES = {
    "gemm": {"dtypes": ["fp32", "bf16"], "m": [8, 32], "n": [16], "k": [24]},
    "grouped_gemm": {
        "dtypes": ["fp32"],
        "proj": ["fc1", "fc2"],
        "distribution": ["balanced", "skewed"],
        "num_gemms": [3],
        "tokens_per_expert": [5],
        "hidden": [16],
        "ffn": [8],
    },
    "sdpa": {
        "dtypes": ["fp32"],
        "seq_len": [16],
        "micro_bs": [1],
        "n_q_heads": [4],
        "n_kv_heads": [2, 4],
        "head_dim": [8],
        "causal": [True, False],
        "backends": ["auto"],
    },
    "router": {"dtypes": ["fp32"], "num_tokens": [32], "num_experts": [8], "k": [2], "hidden": [16]},
    "elementwise": {"dtypes": ["fp32"], "tokens": [8], "hidden": [32], "rope_head_dim": 8},
    "vocab": {"dtypes": ["bf16"], "tokens": [8], "hidden": [16], "vocab": [64]},
    "dispatch": {
        "dtypes": ["fp32"],
        "m": [4],
        "k": [16],
        "chain_len": [8],
        "host_tokens": 4,
        "host_hidden": 8,
        "host_layers": [1, 2, 4],
    },
}


def tiny_preset(suites: dict | None = None, **extra) -> dict:
    return {
        "name": "tiny",
        "timing": FAST_TIMING,
        "mem_fraction": 0.5,
        "cpu_threads": 1,  # the test machine may be shared: no OpenMP oversubscription
        "suites": suites or TINY_SUITES,
        **extra,
    }


@pytest.fixture()
def tiny():
    return tiny_preset


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Suites measured in the test process run on one torch intra-op thread, as the tiny presets ask
    (cpu_threads 1): on a shared 2-core machine two OpenMP threads spin at every tiny op's barrier
    while another process holds a core, and a probe of a few thousand ops took minutes instead of
    seconds. Restored after the test."""
    torch = pytest.importorskip("torch")
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)
