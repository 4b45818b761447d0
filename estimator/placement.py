"""Where one parallel group's ranks fall: the scale-up (NVLink) domains it spans, counted from its ranks.

A group of a plan is n ranks s apart in Megatron-Core's rank order (:data:`scaleplan.estimator.layout.GROUPS`);
the groups of one kind are the progressions b + j s (j < n) with first ranks b = l + u s n (l < s,
u < W / (s n)), W the plan's ranks. Ranks fill domains in order: rank r sits in domain r // D, D GPUs per domain
as the job holds it (a node; on a GB200 NVL72, whose rack holds 72 GPUs in 18 trays of 4, the trays a job takes
from each rack: :func:`plans_domain`, 64 GPUs for a job of 256 under SLURM's --segment).

Aligned groups: where s >= D, or D is a multiple of s and s n divides D or is a multiple of it, every group of the
kind spans the same ceil(n / m) domains with m = min(max(floor(D / s), 1), n) ranks in each: the closed form the
layout always used, kept bit for bit (every layout whose degrees are powers of two, on 8-GPU nodes).

Other groups straddle domain boundaries unevenly: with D = 72, EP 64 on 128 GPUs has one group on ranks 0-63
(one rack) and one on ranks 64-127 (8 ranks in the first rack, 56 in the second); a 6-rank group on 8-GPU nodes
has ranks 6-11 on two nodes. A step waits for its slowest group, so a plan's figures are the worst group's: the
most domains one group spans, and the fewest ranks a spanning group has in one domain (its bottleneck: those
ranks' NICs carry the most of the group's bytes across domains). Counted exactly from the ranks, once per
(s, n, W, D) (a plan set has few distinct ones), arrays over plans.
"""
from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import ArrayLike
from scaleplan.estimator.sources import distinct

if TYPE_CHECKING:
    from scaleplan.profiles import ClusterProfile


def span(stride: ArrayLike, size: ArrayLike, world: ArrayLike, domain: int) -> tuple[np.ndarray, np.ndarray]:
    """(domains, ranks_per_domain) of the worst group of n = ``size`` ranks ``stride`` apart among ``world`` ranks,
    ``domain`` GPUs per scale-up domain (module docstring): float arrays over plans (broadcast). A group inside
    one domain has all its n ranks there."""
    s, n, w = np.broadcast_arrays(*(np.asarray(x, dtype=np.int64) for x in (stride, size, world)))
    per = np.minimum(np.maximum(np.floor(domain / s), 1.0), np.maximum(n, 1.0))
    doms = np.ceil(n / per)
    d = int(domain)
    sn = np.maximum(s * n, 1)
    aligned = (s >= d) | ((d % np.maximum(s, 1) == 0) & ((sn % d == 0) | (d % sn == 0)))
    if aligned.all():
        return doms, per
    bad = np.flatnonzero(~aligned.reshape(-1))
    sb, nb, wb = s.reshape(-1)[bad], n.reshape(-1)[bad], w.reshape(-1)[bad]
    first, inv = distinct(sb, nb, wb)  # few distinct (s, n, W) among many plans
    exact = np.array([_exact(int(sb[i]), int(nb[i]), int(wb[i]), d) for i in first], dtype=float).reshape(-1, 2)
    doms, per = doms.astype(float).reshape(-1), per.astype(float).reshape(-1)
    doms[bad], per[bad] = exact[inv, 0], exact[inv, 1]
    return doms.reshape(s.shape), per.reshape(s.shape)


def plans_domain(profile: ClusterProfile, n_devices: ArrayLike) -> int:
    """The scale-up domain D of the module docstring for plans of ``n_devices`` ranks (an array over plans, one
    value: every evaluation is of one world size): :meth:`ClusterProfile.job_domain`; the profile's domain for no
    plans. Raises ValueError where the plans' world sizes differ."""
    worlds = np.unique(np.asarray(n_devices, dtype=np.int64))
    if len(worlds) > 1:
        raise ValueError(f"plans of one evaluation: world sizes {worlds.tolist()}; one is allowed")
    return profile.job_domain(int(worlds[0])) if len(worlds) else profile.scaleup_domain


@lru_cache(maxsize=4096)
def _exact(s: int, n: int, w: int, d: int) -> tuple[int, int]:
    """(most domains one group spans, fewest ranks a spanning group holds in one domain; n where none spans),
    from every group's ranks."""
    n = max(n, 1)
    per_base = max(w // (s * n), 1)
    bases = (np.arange(s)[:, None] + np.arange(per_base)[None, :] * s * n).reshape(-1)
    dom = (bases[:, None] + np.arange(n)[None, :] * s) // d          # [groups, n], rising along each row
    row = np.repeat(np.arange(len(bases)), n)
    key, counts = np.unique(row * (int(dom.max()) + 1) + dom.reshape(-1), return_counts=True)
    owner = key // (int(dom.max()) + 1)
    n_dom = np.bincount(owner, minlength=len(bases))
    fewest = np.full(len(bases), n)
    np.minimum.at(fewest, owner, counts)
    spanning = n_dom > 1
    return int(n_dom.max()), int(fewest[spanning].min()) if spanning.any() else n
