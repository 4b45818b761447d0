"""A fake predictor with known physics, so the fit and the report can be checked exactly."""
import math

import numpy as np
from scaleplan.calibrate.evaluate import Prediction

GPN = 8  # GPUs per node


def fake_analytic(o):
    """chi = 1 prediction from the layout alone: MFU falls with pp (bubble-like) and with ep."""
    lay = o.layout
    mfu = 0.30 / (1 + 0.05 * (lay["pp"] - 1)) / (1 + 0.02 * math.log2(lay["ep"]))
    t_an = 10.0 * 0.30 / mfu  # seconds; t * MFU constant for one spec
    t_a2a = 0.25 * t_an * (lay["ep"] / 16)
    return Prediction(t_analytic_s=t_an, mfu_analytic=mfu, t_a2a_s=t_a2a,
                      ep_nodes=math.ceil(lay["ep"] * lay["etp"] / GPN), pp_nodes=math.ceil(lay["pp"] / GPN),
                      deep_pp_in_node=lay["pp"] >= GPN and lay["pp"] <= GPN)


def fake_predictor(obs):
    return [fake_analytic(o) for o in obs]


def true_chi(pred, c):
    return (1 + c["c_a2a"] * (pred.t_a2a_s / pred.t_analytic_s) * (pred.ep_nodes > 1)
            + c["c_pp"] * (pred.pp_nodes - 1) + c["c_ovl"] * pred.deep_pp_in_node)


def synthetic_csv(path, coeffs, seed=0, noise=0.01, norm_sweep=True):
    """Two sweeps on 64 GPUs; 'measured' step time = fake t_analytic * chi_true * noise (the fake's
    MFU x t is 3.0 for every layout). Sweep A gets step times, sweep B only MFU ratios."""
    from scaleplan.calibrate.evaluate import Observed

    rng = np.random.default_rng(seed)
    lines = ["sweep,model,n_devices,gbs,seqlen,tp,cp,pp,ep,dp,mbs,measured_t_iter_s,mfu_norm"]
    rows = []
    for sweep in ("A", "B"):
        for pp in (1, 2, 4, 8, 16):
            for ep in (1, 4, 8, 16):
                dp = 64 // pp
                if dp % ep:
                    continue
                o = Observed(id=0, sweep=sweep, profile="", spec={}, n_devices=64,
                             layout=dict(tp=1, cp=1, pp=pp, dp=dp, ep=ep, etp=1, vpp=1, mbs=1, ckpt="full"))
                p = fake_analytic(o)
                mfu = p.mfu_analytic / true_chi(p, coeffs) * math.exp(rng.normal(0, noise))
                rows.append((sweep, pp, ep, dp, mfu))
    for sweep in ("A", "B"):
        top = max(r[4] for r in rows if r[0] == sweep)
        for s, pp, ep, dp, mfu in rows:
            if s != sweep:
                continue
            t = f"{3.0 / mfu:.8f}" if (sweep == "A" or not norm_sweep) else ""
            lines.append(f"{s},moe-700m,64,256,8192,1,1,{pp},{ep},{dp},1,{t},{mfu / top:.6f}")
    path.write_text("\n".join(lines) + "\n")
    return path


def copy_sqlite(url: str, dest) -> str:
    """A private copy of an SQLite database (sqlite3 backup API, WAL-safe), so tests never write to
    the session-wide recorded_db other areas read."""
    import sqlite3

    src = sqlite3.connect(url.removeprefix("sqlite:///"))
    dst = sqlite3.connect(str(dest))
    with dst:
        src.backup(dst)
    src.close()
    dst.close()
    return f"sqlite:///{dest}"
