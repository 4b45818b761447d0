"""Published training runs of today's MoE models (prints figures; asserts nothing): each run's step time
uncalibrated against the one its publisher measured, its breakdown, and memory per GPU at its published layout and
training stack. The runs and their sources are scaleplan/published/runs.yaml (``scaleplan spec published`` lists
them); its groups, printed in order with a MAPE each:

1. Megatron-Bridge's 26.04.01 container on B200 and H100: Qwen3-30B-A3B, GPT-OSS-120B, Qwen3-235B-A22B and
   DeepSeek-V3 at their published layouts and stacks (the issue's seven runs), beside reruns of the same jobs on
   the paper's stack (no published figure).
2. The same models at the other B200 layouts of earlier containers, each with its container's stack.
3. The 26.04.01 GB200 rows, on a profile with no measured table (its kernels the B200's rows scaled), and the 26.06
   container's GB200 rows, the whole step one CUDA graph.
4. Qwen3-30B-A3B on 16 H100 in bf16, Megatron-Bridge's controlled comparisons (HybridEP or the all-to-all
   dispatcher, the all-to-all overlapped or not, CUDA graphs or eager).
5. The B300 and GB300 rows of the 26.04.01 and 26.06 containers and Kimi-K2's GB300 run.
6. Rows of the archive's earlier containers that differ from a row above in one stated choice.

Then a diagnostic scan, applied to nothing: every published row with the dispatch law's host seconds scaled by
a factor f (:func:`host_scan`), which shows how much of each row's error the host side can account for.

    python benchmarks/stack_examples.py --db URL-with-the-recorded-and-own-tables [--json]

The database needs ../shared/recorded/dmlc-scaleplan (`scaleplan db import-scaleplan`) and scaleplan's own
tables (`scaleplan db import-recorded`) for the H100.
"""
from __future__ import annotations

import argparse
import json

from scaleplan.estimator import Estimator

from scaleplan import published
from scaleplan.specs import Layout, parse_spec


def _published_rows() -> list[tuple[str, list[str]]]:
    """(label, run names) of each set of published runs, in print order (scaleplan/published/runs.yaml)."""
    return [(label, [r.name for r in published.runs() if r.group == label]) for label, _ in published.groups()]


GROUPS = _published_rows()


def run(db: str | None, host_scale: float | None = None) -> list[dict]:
    out = []
    for run_ in published.runs():
        spec = parse_spec(run_.doc, source=run_.id)
        est = Estimator(run_.system, db, use_calibration=False, host_scale=host_scale)
        r = est.estimate(spec, run_.devices, [Layout(**run_.layout)])[0]
        top = sorted(r.breakdown_s.items(), key=lambda kv: -kv[1])[:6]
        out.append({"example": run_.name, "t_iter_s": r.t_iter_s, "published_t_iter_s": run_.published_step_s,
                    "mfu": r.mfu, "feasible": r.feasible,
                    "mem_gb": r.mem_per_device_gb, "mem_breakdown_gb": r.mem_breakdown_gb,
                    "top_components_s": dict(top), "sources": {k: r.sources[k] for k, _ in top}})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default=None)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rows = run(a.db)
    if a.json:
        print(json.dumps(rows, indent=1, default=float))
        return
    for r in rows:
        if r["published_t_iter_s"]:
            print(f"{r['example']}: published step {r['published_t_iter_s']:.2f} s, predicted / published "
                  f"{r['t_iter_s'] / r['published_t_iter_s']:.2f}")
        comps = ", ".join(f"{k} {v:.2f}" for k, v in r["top_components_s"].items())
        mem = ", ".join(f"{k} {v:.1f}" for k, v in r["mem_breakdown_gb"].items() if v > 0.05)
        print(f"{r['example']}: step {r['t_iter_s']:.2f} s (MFU {100 * r['mfu']:.1f}%), memory {r['mem_gb']:.1f} GB "
              f"({'fits' if r['feasible'] else 'does not fit'})\n   top terms (s): {comps}\n   memory (GB): {mem}")
    every = []
    for label, rs in _published_sets(rows):
        ratios = [r["t_iter_s"] / r["published_t_iter_s"] for r in rs]
        every += ratios
        print(f"published runs, {label}: {len(ratios)}, predicted / published {min(ratios):.2f}-{max(ratios):.2f}, "
              f"MAPE {100 * _mape(ratios):.1f}%")
    print(f"published runs, all: {len(every)}, MAPE {100 * _mape(every):.1f}%")
    host_scan(a.db)


def _published_sets(rows: list[dict]) -> list[tuple[str, list[dict]]]:
    """The rows with a published step time by :data:`GROUPS`: the issue's seven first."""
    pub = {r["example"]: r for r in rows if r["published_t_iter_s"]}
    return [(label, [pub[n] for n in names if n in pub]) for label, names in GROUPS]


def _mape(ratios: list[float]) -> float:
    return sum(abs(x - 1.0) for x in ratios) / len(ratios)


# host-side factors of the scan: the law's t_gap, t_host and t_ep_host all scaled (Estimator(host_scale=...))
HOST_SCAN = (1.0, 0.75, 0.5, 0.35, 0.25)


def host_scan(db: str | None) -> None:
    """What the published rows say about the dispatch law on stock Megatron-Core, printed, not used: every row's
    predicted / published with the law's host seconds scaled by each factor of :data:`HOST_SCAN` (the law was
    traced on the paper's own stack; nothing here is fitted or applied to any prediction)."""
    print("host-side scan (the dispatch law's host seconds x f, every published row by group: "
          + " | ".join(label for label, _ in GROUPS) + "; diagnostic, not applied):")
    for f in HOST_SCAN:
        groups = [[r["t_iter_s"] / r["published_t_iter_s"] for r in rs] for _, rs in _published_sets(run(db, f))]
        every = [x for g in groups for x in g]
        inside = sum(0.75 <= x <= 1.33 for x in every)
        print(f"   f={f:<4g} " + " | ".join(" ".join(f"{x:.2f}" for x in g) for g in groups)
              + f"  MAPE {100 * _mape(groups[0]):.1f}% ({len(groups[0])}), {100 * _mape(every):.1f}% "
              f"({len(every)}); {inside} of {len(every)} within 0.75-1.33")

if __name__ == "__main__":
    main()
