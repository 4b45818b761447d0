"""Plain-dict inputs of the HTML report (the shapes of the commands' JSON outputs), generated, not recorded."""
from __future__ import annotations

import math


def candidate(i: int, g: int, p_optimal: float | None = None) -> dict:
    """A search candidate row: ladder q = 8 + i % 3 (L = 4q, d = 512q), loss falling with C_model."""
    q = 8 + i % 3
    L, d = 4 * q, 512 * q
    n_act = 1e9 * (5 + i)
    c_model = 1e21 * (1.3 ** i)
    row = {"q": q, "n_layers": L, "n_experts": 32 * g, "topk": 1 + i % 2, "g": g, "n_act": n_act,
           "n_tot": 20 * n_act, "s": 0.95, "tpp": 100.0, "d_tokens": c_model / (6 * n_act), "c_model": c_model,
           "mfu": 0.2 + 0.001 * i, "composed_share": 0.1, "loss": 2.0 - 0.1 * math.log10(c_model / 1e21) - 0.01 * g,
           "mem_per_device_gb": 150.0 + i % 7,
           "layout": {"tp": 1, "cp": 1, "pp": 2, "ep": 8, "dp": 16, "mbs": 4, "ckpt": "full", "etp": 1, "vpp": 1},
           "geometry": {"n_layers": L, "d": d, "d_ff": int(2.5 * d), "d_expert": int(2.5 * d) // g, "n_heads": L,
                        "n_kv_heads": 8, "head_dim": 128, "vocab": 257536, "n_experts": 32 * g, "topk": 1 + i % 2,
                        "g": g, "d_shared_expert": int(2.5 * d) // g}}
    if p_optimal is not None:
        row["p_optimal"] = p_optimal
    return row


PROVENANCE = {"profile": "p6-b200.48xlarge", "extrapolate": "compose",
              "calibration": [{"id": 7, "kind": "chi_sys", "version": 2, "profile": "p6-b200.48xlarge",
                               "fitted_at": "2026-11-20T10:00:00", "fitted_on": "12 observations", "n_obs": 12,
                               "cv_error": 0.08, "notes": ""}],
              "calibration_used": True, "dispatch_law": "calibration 8",
              "table_runs": [{"id": 9, "suite": "gemm", "source": "imported", "gpu_name": "NVIDIA B200",
                              "started_at": "2026-11-25 08:27:39", "source_file": "gemm_util.parquet",
                              "n_points": 14316}]}


def search_dict(n: int = 24) -> dict:
    """A search JSON with a frontier of n points over G in {1, 2, 4, 8}, a by-sparsity view and a sweep."""
    frontier = [candidate(i, (1, 2, 4, 8)[i % 4], p_optimal=1.0 / n) for i in range(n)]
    best = min(frontier, key=lambda r: r["loss"])
    sweep = [{"nodes": nodes, "days": 20.0, "c_peak": 1e23 * nodes, "gpu_hours": nodes * 8 * 480.0,
              "best": candidate(k, 2), "best_per_g": {str(g): candidate(k + g, g) for g in (1, 2, 4)},
              "n_feasible": 10} for k, nodes in enumerate((16, 32, 64))]
    by_s = [{**candidate(i, 2), "s": 0.9 + 0.01 * i, "c_deliverable": 1e23, "prescription_feasible": i < 3,
             "extrapolated": []} for i in range(6)]
    return {"best": best, "top": sorted(frontier, key=lambda r: r["loss"])[:5], "frontier": frontier,
            "n_candidates": 100, "n_feasible": n, "n_grid": 200, "c_peak": 1e24, "n_devices": 256,
            "profile": "p6-b200.48xlarge", "law": "paper", "mem_fraction": 0.95, "analytic_components": ["pp_p2p"],
            "envelope": {"nodes": 32, "days": 20.0, "goodput": 1.0, "gbs": 1024, "seqlen": 2048,
                         "optimizer": "adamw", "tpp_min": 40.0, "tpp_max": 150.0},
            "provenance": PROVENANCE, "sweep": sweep, "sweep_axis": "nodes", "by_sparsity": by_s, "s_max": 0.985,
            "megatron_args": "# 256 GPUs\n  --num-layers 40"}


def calibrate_dict() -> dict:
    runs = [{"sweep": s, "id": 10 * k + i, "layout": "tp=1 pp=2", "measured": 0.2 + 0.02 * i,
             "before": 0.25 + 0.02 * i, "after": 0.21 + 0.02 * i, "loso": 0.22, "reference": None}
            for k, s in enumerate(("700m", "5.4b")) for i in range(5)]
    return {"calibration_id": 7, "coefficients": {"c_a2a": 0.1, "c_level": 0.05}, "profile": "p6-b200.48xlarge",
            "mode": "absolute", "n_obs": 10, "runs": runs,
            "sweeps": [{"sweep": "700m", "n": 5, "mape_before": 0.2, "mape_after": 0.05, "loso_mape": 0.07,
                        "spearman": 0.9}]}


def validate_dict() -> dict:
    rows = [{"layout": {"tp": 1, "cp": 1, "pp": 1, "dp": 2, "ep": 1, "etp": 1, "vpp": 1, "mbs": m, "ckpt": "full"},
             "measured_t_iter_s": 1.0 * m, "predicted_t_iter_s": 0.9 * m, "measured_mfu": 0.3, "predicted_mfu": 0.33,
             "measured_peak_mem_gb": 2.0, "predicted_mem_gb": 2.1, "observation_id": None,
             "predicted_breakdown_s": {"attn": 0.3 * m, "moe_mlp": 0.5 * m, "optimizer": 0.1 * m}}
            for m in (1, 2)]
    return {"rows": rows, "spec_path": "<tiny>.yaml", "profile": "cpu-local", "device": "cpu"}
