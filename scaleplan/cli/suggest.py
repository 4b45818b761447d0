"""A fix the command line suggests is checked before it is printed.

When a spec's layout does not fit a device count (``estimate SPEC --devices N``: dp*mbs does not divide the
global batch), the suggestion is a ``--layout`` text that, applied to the spec's own layout as ``estimate``
applies it, passes every structural rule the estimator checks (estimator/layout.py RULES: the mesh, EP within
DP and dividing E, whole micro-batches per step, PP*VPP dividing the layers, TP against the heads, ETP, CP
against the sequence). Among those, the one closest to the layout asked for: fewest degrees changed, then the
smallest change in doublings. When no layout of N devices fits, the nearest device counts that have one are
named instead, with theirs. Nothing is suggested that the same command would refuse.
"""
from __future__ import annotations

import numpy as np

#: the degrees a suggestion may change (dp is derived from the device count)
AXES = ("tp", "cp", "pp", "ep", "etp", "vpp", "mbs")
#: how far (in device counts, each way) the nearest fitting device counts are looked for
NEAREST_SPAN = 256


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _grid(spec, want, n: int):
    """Every (tp, cp, pp, ep, etp, vpp, mbs) on ``n`` devices the suggestion may try, as a ParallelLayout (dp
    derived), the checkpointing mode of ``want`` kept."""
    from scaleplan.estimator.ckpt import CkptMode
    from scaleplan.estimator.layout import ParallelLayout

    divs = _divisors(n)
    small = [d for d in divs if d <= max(8, want.tp)]  # TP and CP within a node's NVLink domain, or as asked
    mbs = sorted({want.mbs, 1, 2, 4, 8})
    cols = np.array(np.meshgrid(small, small, divs, divs, sorted({1, want.etp}), sorted({1, want.vpp}), mbs,
                                indexing="ij")).reshape(7, -1)
    tp, cp, pp, ep, etp, vpp, mb = cols
    mesh = tp * cp * pp
    ok = (n % mesh == 0)
    tp, cp, pp, ep, etp, vpp, mb, mesh = (a[ok] for a in (tp, cp, pp, ep, etp, vpp, mb, mesh))
    return ParallelLayout.of(tp=tp, cp=cp, pp=pp, dp=n // mesh, ep=ep, etp=etp, vpp=vpp, mbs=mb,
                             ckpt=CkptMode.parse(want.ckpt).value)


def _valid(spec, lay, n: int) -> np.ndarray:
    from scaleplan.estimator.layout import LayoutContext, stack_rules
    from scaleplan.estimator.model_dims import geometry

    ctx = LayoutContext(geometry(spec.model), n, spec.data.gbs, spec.data.seqlen, **stack_rules(spec.stack))
    return lay.rule_codes(ctx) == 0


def _text(lay, i: int, base) -> str:
    """The --layout text of plan ``i``: the degrees where it differs from the spec's ``base`` layout."""
    return ",".join(f"{k}={int(getattr(lay, k)[i])}" for k in AXES if int(getattr(lay, k)[i]) != getattr(base, k))


def _checked(spec, text: str, base, n: int) -> bool:
    """Whether ``text`` applied to ``base`` as `estimate --layout` applies it (dp derived) passes every rule."""
    from scaleplan.estimator.layout import ParallelLayout
    from scaleplan.specs import parse_layout

    lo = parse_layout(text, base).model_copy(update={"dp": None}) if text else base.model_copy(update={"dp": None})
    lay = ParallelLayout.from_specs([lo], n)
    return int(lay.n_devices[0]) == n and bool(_valid(spec, lay, n)[0])


def fitting_layout(spec, want, n: int) -> str | None:
    """The --layout text (changes from the spec's own layout) of the valid layout on ``n`` devices closest to
    ``want`` (a specs.Layout), checked as `estimate` would apply it; None when no layout of ``n`` devices fits."""
    base = spec.default_layout()
    lay = _grid(spec, want, n)
    ok = np.flatnonzero(_valid(spec, lay, n))
    if not len(ok):
        return None
    changed = sum((getattr(lay, k)[ok] != getattr(want, k)).astype(int) for k in AXES)
    dist = sum(np.abs(np.log2(getattr(lay, k)[ok] / getattr(want, k))) for k in AXES)
    for i in ok[np.lexsort((dist, changed))]:
        text = _text(lay, int(i), base)
        if _checked(spec, text, base, n):
            return text
    return None


def nearest_devices(spec, want, n: int) -> list[tuple[int, str]]:
    """The nearest device count below and above ``n`` (within NEAREST_SPAN) on which a layout fits, each with its
    checked --layout text."""
    out = []
    for step in (-1, 1):
        for m in range(n + step, n + step * NEAREST_SPAN, step):
            if m < 1:
                break
            text = fitting_layout(spec, want, m)
            if text is not None:
                out.append((m, text))
                break
    return out


def batch_hint(spec, want, n: int) -> str:
    """What to do when dp*mbs does not divide the global batch: a checked --layout on ``n`` devices, else the
    nearest device counts that fit, else say that none does."""
    text = fitting_layout(spec, want, n)
    if text is not None:
        return (f"with {n} devices e.g. --layout {text} fits (checked against every layout rule); "
                "`scaleplan layouts` ranks the layouts that fit")
    near = nearest_devices(spec, want, n)
    if not near:
        return f"no layout of {n} devices fits it"
    alts = " or ".join(f"--devices {m}" + (f" --layout {t}" if t else "") for m, t in near)
    return f"no layout of {n} devices fits this model and batch; {alts} does (checked against every layout rule)"
