"""What FP8 costs on one GPU, from a database holding a `bench run --preset single-gpu-fp8` run: the paired
FP8 / bf16 device-time ratios the estimator's FP8 rules assume.

1. Dense GEMMs: t(fp8) / t(bf16) at each shape measured in both dtypes, by m (the rule with no FP8 rows,
   ``analytic.gemm_lane_ratio``, takes the bf16 / FP8 peak of the lanes: 0.5 on H100, H200, B200), and the
   FP8 call's eager wall per call beside its device time (a host floor would show here).
2. The FP8 expert projection, with its casts and (where the note gives them) its GEMMs alone, per
   implementation, against the composed rule: the bf16 grouped time of the same point times the dense FP8 /
   bf16 device-time ratio of the same GEMMs (fp8_costs.composed_projection, on the estimator's tables of the
   profile in the first database), forward and backward.
3. The bench's quantize casts against the bytes a fused cast moves at the profile's HBM bandwidth.

    python benchmarks/fp8_ratios.py --db sqlite:///sp.db [--db sqlite:///more.db] [--profile h200-single]

Prints medians and ranges; the rows compared are measured ones only (bench runs of source 'measured').
"""
from __future__ import annotations

import argparse

import numpy as np
import pandas as pd
import sqlalchemy as sa


def _rows(engines, table: str, profile: str) -> pd.DataFrame:
    """The OK rows of ``table`` from measured runs of ``profile``, over every database given; where several
    runs measured one point, the latest run's row (largest run id within its database, later databases last)."""
    q = (f"SELECT p.* FROM {table} p JOIN bench_run r ON p.run_id = r.id "
         "WHERE r.source = 'measured' AND r.profile = :prof AND p.status = 'OK' ORDER BY r.id")
    return pd.concat([pd.read_sql(sa.text(q), e, params={"prof": profile}) for e in engines], ignore_index=True)


def dense_ratios(g: pd.DataFrame) -> pd.DataFrame:
    """One row per shape measured in both dtypes: ratio = t_s(fp8) / t_s(bf16), wall = the FP8 eager wall."""
    key = ["m", "n", "k"]
    g = g.drop_duplicates(key + ["dtype"], keep="last")
    both = g[g.dtype == "fp8"][key + ["t_s", "note"]].merge(g[g.dtype == "bf16"][key + ["t_s"]], on=key,
                                                             suffixes=("", "_bf16"))
    both["ratio"] = both.t_s / both.t_s_bf16
    both["wall"] = both.note.str.extract(r"wall_per_call_s=([0-9.e+-]+)", expand=False).astype(float)
    return both


def grouped_vs_composed(gg: pd.DataFrame, tables) -> pd.DataFrame:
    """Per FP8 grouped row with a bf16 row at its point: measured over the composed rule
    (fp8_costs.composed_projection on ``tables``, the estimator's tables of the profile), with the casts
    (fwd_ / bwd_vs_composed) and for the GEMMs alone where the note gives them (gemm_fwd_ / gemm_bwd_...)."""
    from scaleplan.estimator.fp8_costs import composed_projection

    key = ["proj", "distribution", "num_gemms", "tokens_per_expert", "hidden", "ffn"]
    gg = gg.drop_duplicates(key + ["dtype", "impl"], keep="last")  # one FP8 row per implementation
    both = gg[gg.dtype == "fp8"][key + ["fwd_s", "bwd_s", "in_features", "out_features", "impl", "note"]].merge(
        gg[gg.dtype == "bf16"][key + ["fwd_s", "bwd_s"]], on=key, suffixes=("", "_bf16"))
    fwd, bwd = composed_projection(tables.view("fp8", 1.0).gemm, tables.gemm, *(both[c].to_numpy(float) for c in (
        "tokens_per_expert", "out_features", "in_features", "fwd_s_bf16", "bwd_s_bf16")))
    both["fwd_vs_composed"], both["bwd_vs_composed"] = both.fwd_s / fwd, both.bwd_s / bwd
    both["fwd_fp8_over_bf16"] = both.fwd_s / both.fwd_s_bf16
    for d_, composed in (("fwd", fwd), ("bwd", bwd)):
        gemm = both.note.str.extract(rf"gemm_{d_}_s=([0-9.e+-]+)", expand=False).astype(float)
        both[f"gemm_{d_}_vs_composed"] = gemm / composed
    return both


def _spread(x: pd.Series) -> str:
    x = x.dropna()
    if not len(x):
        return "no points"
    return f"median {x.median():.3f} (p10 {x.quantile(0.1):.3f}, p90 {x.quantile(0.9):.3f}, n {len(x)})"


def _print_grouped(impl: str, gg: pd.DataFrame) -> None:
    print(f"FP8 expert projection, impl {impl}:")
    print(f"  fwd FP8 / bf16 grouped: {_spread(gg.fwd_fp8_over_bf16)}")
    print(f"  fwd measured / composed: {_spread(gg.fwd_vs_composed)}")
    print(f"  bwd measured / composed: {_spread(gg.bwd_vs_composed)}")
    print(f"  GEMMs alone (casts outside): fwd / composed {_spread(gg.gemm_fwd_vs_composed)}; "
          f"bwd / composed {_spread(gg.gemm_bwd_vs_composed)}")
    for key in ("num_gemms", "tokens_per_expert"):
        for v, part in gg.groupby(key):
            print(f"  {key} {v:>4}: GEMMs alone fwd {_spread(part.gemm_fwd_vs_composed)}, "
                  f"bwd {_spread(part.gemm_bwd_vs_composed)}")
    within = ((gg.gemm_fwd_vs_composed - 1).abs() <= 0.2).mean()
    print(f"  share of points with the GEMMs' fwd within 20% of composed: {within:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", required=True, action="append", help="a database URL; repeat to read several")
    ap.add_argument("--profile", default="h200-single")
    a = ap.parse_args()
    from scaleplan.bench.fp8 import cast_bytes
    from scaleplan.estimator import Estimator

    from scaleplan.profiles import load_profile

    eng = [sa.create_engine(u) for u in a.db]
    d = dense_ratios(_rows(eng, "gemm_point", a.profile))
    print(f"dense FP8 / bf16 device time, all shapes: {_spread(d.ratio)}")
    for m, part in d.groupby("m"):
        print(f"  m {m:>6}: {_spread(part.ratio)}; FP8 eager wall / device {_spread(part.wall / part.t_s)}")
    big = d[d.m * d.n * d.k >= 4096**3]
    print(f"  2mnk >= 2 x 4096^3: {_spread(big.ratio)}")
    tables = Estimator(a.profile, a.db[0]).tables  # the dense tables the rule reads: the first database's
    if "fp8" not in tables.by_dtype or tables.gemm is None:
        print(f"FP8 expert projection: {a.db[0]} holds no FP8 and bf16 dense GEMM rows of {a.profile}")
        return
    gg = grouped_vs_composed(_rows(eng, "grouped_gemm_point", a.profile), tables)
    if gg.empty:
        print("FP8 expert projection: no FP8 and bf16 pairs")
    for impl, part in (gg.groupby("impl") if len(gg) else ()):
        _print_grouped(impl, part)
    ew = _rows(eng, "elementwise_point", a.profile)
    hbm = load_profile(a.profile).hbm_bandwidth
    for op, part in ew[ew.op.str.startswith("quantize_")].groupby("op"):
        recipe = op.removeprefix("quantize_")
        model = [cast_bytes(t, h, recipe) / hbm for t, h in zip(part.tokens, part.hidden)]  # a fused cast
        print(f"  {op} (the bench's cast, rowwise + transposed copy): measured / fused-cast bytes at HBM "
              f"{_spread(part.fwd_s / np.array(model))}")


if __name__ == "__main__":
    main()
