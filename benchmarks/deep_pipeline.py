"""The 18B sweep's structure, read off its step times (prints figures; estimator_accuracy.py calls it).

Two checks that do not depend on the level of the host law, for the layouts the 700M and 5.4B sweeps
cannot judge (deep pipelines, an expert group across nodes):

* **Slot time against the micro-batch** at one (PP, EP, layers per stage): the step over its 1F1B slots,
  t_iter / (n_mb + PP - 1), fitted as a + b mbs (measured | ours), and, with three micro-batch sizes, the
  exact split of the measured step into a per-slot a + b mbs on every slot and a per-step C. b is what
  one more sample adds to a slot. It is compared with what ours charges per sample to the pacing stage
  (its layers and the LM head + cross-entropy) and to a stage without the LM head: if the fill and drain
  ran at the other stages' periods (the classic 1F1B ramp), the step would grow per sample by n_mb x the
  pacing slope + (PP - 1) x the other stages' slope; b equal to the pacing stage's slope says every slot,
  fill and drain included, lasts a pacing period (eq:bubble's f_bubble x t_block with the LM head in
  t_block, the paper's ramp term).
* **The serial floor of an expert group across nodes**: the least step a layout can take if every
  all-to-all runs between compute kernels (Megatron-Core's alltoall dispatcher with shared-expert overlap:
  the exchange's output is the next kernel's input): every slot of a stage carries its layers' FLOPs at
  the device's dense peak (forward, recompute and backward: 8 N_layer T plus causal attention 8 s nq hd T)
  and its six all-to-alls per MoE layer (dispatch and combine, forward, recompute and backward) of
  T K d bf16 bytes at the NIC's line rate for the share that leaves the node, and the last stage adds the
  LM head's 6 V d T FLOPs per micro-batch. A measured step below it, or within a few percent of it, says
  the all-to-all did not run serially with compute in that run.

Seconds and milliseconds as labelled. Nothing here is fitted into the model.
"""
from __future__ import annotations

import numpy as np
from scaleplan.estimator.iteration import LAYER_TERMS


def _slots(spec, lo) -> tuple[int, int]:
    n_mb = spec.data.gbs // (lo.dp * lo.mbs)
    return n_mb, n_mb + lo.pp - 1


def _per_sample(xs, ys) -> float:
    """Least-squares slope of ys against xs."""
    return float(np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)[0])


def slot_vs_microbatch(sw, preds: dict) -> None:
    """Per (sweep, PP, EP, layers per stage) with two or more micro-batch sizes (module docstring)."""
    print("slot time a + b mbs at one (PP, EP), over the micro-batch size (ms; measured | ours):")
    for name, spec, n, lays, real, _ in sw:
        groups: dict[tuple, list] = {}
        for i, lo in enumerate(lays):
            groups.setdefault((lo.pp, lo.ep, spec.model.n_layers // lo.pp), []).append(i)
        for (pp, ep, ls), idx in groups.items():
            mbs = sorted({lays[i].mbs for i in idx})
            if len(mbs) < 2:
                continue
            idx = sorted(idx, key=lambda i: lays[i].mbs)
            m = np.array([lays[i].mbs for i in idx], float)
            n_slot = np.array([_slots(spec, lays[i])[1] for i in idx], float)
            n_mb = np.array([_slots(spec, lays[i])[0] for i in idx], float)
            ours = np.array([preds[name][i].t_iter_s for i in idx])
            cells = []
            for t in (real[idx], ours):
                b, a = np.polyfit(m, 1e3 * t / n_slot, 1)
                cells.append(f"a {a:4.0f} b {b:4.0f}")
            def per_slot(ts):
                return " ".join(f"{1e3 * t / k:.0f}" for t, k in zip(ts, n_slot))
            print(f"   {name} pp={pp} ep={ep} L_stage={ls} mbs {'/'.join(str(int(x)) for x in m)}: "
                  f"slots {'/'.join(str(int(x)) for x in n_slot)}, measured {per_slot(real[idx])} | ours "
                  f"{per_slot(ours)}: " + " | ".join(cells))
            if len(m) >= 3:
                _three_way(m, n_slot, n_mb, real[idx], [preds[name][i] for i in idx])


def _three_way(m, n_slot, n_mb, real, res) -> None:
    """The measured step as n_slot (a + b mbs) + C (exact with three points, least squares beyond), beside
    ours' per-sample slopes of the pacing stage (layers + LM head) and of the layers alone."""
    A = np.column_stack([n_slot, n_slot * m, np.ones_like(m)])
    (a, b, c), *_ = np.linalg.lstsq(A, real, rcond=None)
    layers = np.array([sum(r.breakdown_s.get(k, 0.0) for k in LAYER_TERMS) for r in res]) / n_mb
    # the model charges the LM head's exposed part on every slot (estimator/pipeline.py), so per slot
    lm = np.array([r.breakdown_s.get("vocab", 0.0) for r in res]) / n_slot
    pace, mid = _per_sample(m, 1e3 * (layers + lm)), _per_sample(m, 1e3 * layers)
    print(f"      measured = slots x ({1e3 * a:.0f} + {1e3 * b:.0f} mbs) ms + {c:.2f} s per step; ours per sample: "
          f"pacing stage (layers + LM head) {pace:.0f} ms, layers alone {mid:.0f} ms. A fill and drain at the "
          f"other stages' periods would grow by {mid:.0f}, not {pace:.0f}, per sample and ramp slot")


def serial_floor(spec, lay, profile) -> float:
    """Least step (seconds) of ``lay`` with every all-to-all serial with compute (module docstring)."""
    from scaleplan.estimator.model_dims import geometry

    g = geometry(spec.model)
    T = spec.data.seqlen * lay.mbs / (lay.tp * lay.cp)
    n_mb, n_slot = _slots(spec, lay)
    peak, gpn = profile.peak(g.precision), profile.gpus_per_node
    n_layer = g.n_act / g.L
    flops = 8.0 * n_layer * T + 8.0 * spec.data.seqlen * g.nq * g.hd * T / lay.cp  # fwd, recompute, bwd
    off_node = max(lay.ep - gpn, 0) / lay.ep
    a2a = 6.0 * T * g.K * g.d * 2.0 * off_node / profile.scaleout_bandwidth if g.is_moe else 0.0
    stage = (g.L / lay.pp) * (flops / peak + a2a)
    lm = 6.0 * g.vocab * g.d * T / peak
    return n_slot * stage + n_mb * lm


def floors(sw, profile) -> None:
    """The serial floor beside the measured step of every layout whose expert group leaves the node."""
    rows = []
    for name, spec, n, lays, real, _ in sw:
        for lo, t in zip(lays, real):
            if lo.ep * lo.tp > profile.gpus_per_node:
                f = serial_floor(spec, lo, profile)
                rows.append(f"{name} pp={lo.pp} ep={lo.ep}: floor {f:.2f} s, measured {t:.2f} s ({t / f:.2f}x)")
    print("serial floor of an expert group across nodes (all-to-all at NIC line rate between compute at dense "
          "peak; measured / floor): " + ";  ".join(rows))
