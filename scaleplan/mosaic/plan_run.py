"""The steps of :func:`scaleplan.mosaic.plan.run_plan`: the context (law, grid, estimators, plan bank, goodput
and prices per platform and node count, the draws), the points per target, the forward question, the
per-platform summaries, the refusal of an unreachable target, the chosen point and its launchable outputs.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from scaleplan.errors import SpecError
from scaleplan.mosaic import plan_points as pp
from scaleplan.mosaic.search import SECONDS_PER_DAY, Envelope, row_json


@dataclass
class Context:
    """Everything the answer is computed from (built once; the bank's plans are shared by every question)."""

    r: object
    profs: dict
    ests: dict
    loaded: object
    grid: object
    bank: object
    keys: list
    eta: dict
    prices: dict
    env: Envelope
    sigma: dict
    pd: object

    @classmethod
    def build(cls, r, profs: dict) -> Context:
        from scaleplan.estimator import Estimator
        from scaleplan.mosaic.ladder import enumerate_geometries
        from scaleplan.mosaic.law import load_law_full
        from scaleplan.mosaic.plan import default_nodes, prices_of
        from scaleplan.mosaic.planbank import PlanBank
        from scaleplan.mosaic.run import ladder_grid, plan_constraints
        from scaleplan.mosaic.search import default_workers
        from scaleplan.mosaic.evidence import observed_range
        from scaleplan.mosaic.plan_draws import PlanDraws
        from scaleplan.mosaic.uncertainty import make_draws, mfu_error

        s = r.search
        loaded = load_law_full(s.db_url if s.law_name else None, s.law_name)
        ests = {p: Estimator(profile=p, db_url=s.db_url, extrapolate=s.extrapolate, use_calibration=s.use_calibration)
                for p in r.platforms}
        if s.stack is not None and r.spec is None:  # plan --stack: the ladder's bf16 models on that training stack
            ests = {p: e.for_stack(s.stack, "bf16") for p, e in ests.items()}
        grid = ladder_grid(s)
        geoms = enumerate_geometries(grid)
        if geoms.empty and r.spec is None:
            raise SpecError("grid", f"{grid.n_combinations} combinations", "at least one realizable geometry "
                            "(K <= E, d_ff divisible by G, S >= --s-min)")
        env = Envelope(nodes=1, days=1.0, gbs=s.gbs, seqlen=s.seqlen, optimizer=s.optimizer, tpp_min=s.tpp_min,
                       tpp_max=s.tpp_max)
        bank = PlanBank(ests, grid, geoms, env, plan_constraints(s), s.workers or default_workers())
        keys = [(p, n) for p in r.platforms for n in (r.nodes.get(p) or default_nodes(profs[p], r.max_gpus))]
        eta = {k: r.goodput.eta(k[1] * profs[k[0]].gpus_per_node) for k in keys}
        draws = (make_draws(s.samples, loaded.ridge, 0.0, 1, s.seed, loaded.law, law_scatter=loaded.scatter)
                 if s.samples else None)
        sigma = {p: mfu_error(s.db_url, p, None, s.use_calibration) for p in r.platforms}
        # each platform's observed runs, as the search measures distance from them (run._attach_reach)
        runs = {p: observed_range(s.db_url, p, profs[p].peak("bf16"), int(profs[p].scaleup_domain))
                for p in r.platforms}
        pdr = PlanDraws(draws, r.confidence, {p: v.sigma for p, v in sigma.items()}, runs, loaded.support,
                        s.tpp_min, s.tpp_max)
        return cls(r, profs, ests, loaded, grid, bank, keys, eta, prices_of(r), env, sigma, pdr)

    def n_dev(self, key) -> int:
        return int(key[1] * self.profs[key[0]].gpus_per_node)

    def peak(self, key) -> tuple[float, int]:
        """(peak bf16 FLOP/s per GPU, GPUs) of ``key``."""
        return self.profs[key[0]].peak("bf16"), self.n_dev(key)

    def price(self, name: str) -> float | None:
        p = self.prices.get(name)
        return None if p is None else p["usd_per_gpu_hour"]

    def window(self, key) -> float:
        """The longest window (days) the constraints allow on ``key`` (inf: none)."""
        r, hours = self.r, 24.0 * self.n_dev(key)
        caps = [r.max_days or np.inf, (r.max_gpu_hours or np.inf) / hours]
        if r.max_cost is not None:
            caps.append(r.max_cost / (hours * self.price(key[0])))
        return float(min(caps))


# ------------------------------------------------------------------------------------------ the points

def _point(ctx: Context, key, days: float, row=None, flags: dict | None = None) -> dict:
    """A point's common fields: where, how long, what it costs, which constraints it breaks; with a scored
    ``row`` its plan (the search's JSON shape) and ``flags`` (PlanDraws.flags: where it lies beyond what was
    measured)."""
    name, nodes = key
    p = {"profile": name, "nodes": nodes, "n_devices": ctx.n_dev(key), "days": float(days),
         "eta_good": float(ctx.eta[key]), **pp.money(ctx.n_dev(key), days, ctx.price(name))}
    r = ctx.r
    p["violates"] = pp.violations(p, r.max_days, r.max_gpu_hours, r.max_cost)
    if row is not None:
        from scaleplan.emit import add_geometry

        plan = row_json(row)
        add_geometry(plan, ctx.grid)
        p["plan"] = plan
        _add_flags(p, flags)
    return p


def _add_flags(p: dict, flags: dict | None) -> None:
    """The point's beyond flags and distances into its plan (as the search's rows carry them), its MFU draw's
    sigma beside."""
    if flags:
        p["plan"].update(beyond=[x for x in flags["beyond"].split(", ") if x], perf_doublings=flags["perf_doublings"],
                         law_doublings=flags["law_doublings"])
        p["mfu_sigma"] = flags["mfu_sigma"]


def _scored_row(ctx: Context, key, i: int, days: float):
    """Geometry ``i`` of the bank scored at ``days`` on ``key`` (search.score: tokens, loss, C_model ...)."""
    from scaleplan.mosaic.search import score

    name, nodes = key
    env = Envelope(nodes=nodes, days=days, goodput=ctx.eta[key], gbs=ctx.env.gbs, seqlen=ctx.env.seqlen,
                   optimizer=ctx.env.optimizer, tpp_min=ctx.env.tpp_min, tpp_max=ctx.env.tpp_max)
    b = ctx.bank
    return score(b.geoms.iloc[[i]], b.plans(*key).iloc[[i]], env, ctx.profs[name].peak("bf16"), ctx.n_dev(key),
                 ctx.loaded.law, ctx.loaded.support).iloc[0]


def target_points(ctx: Context, caps: dict | None = None) -> dict:
    """Per key, the point that reaches --target-loss soonest (at --confidence: in that share of the draws; None
    where none does within ``caps``, the longest window of interest per key: the constraints' by default)."""
    from scaleplan.mosaic.inverse import need, solve_inverse

    r, s, b, pdr = ctx.r, ctx.r.search, ctx.bank, ctx.pd
    nd = need(b.geoms, ctx.loaded.law, r.target_loss, s.tpp_min, s.tpp_max)
    caps = caps or {k: ctx.window(k) for k in ctx.keys}
    if pdr.confidence is None:
        days = solve_inverse(b, ctx.keys, nd, ctx.eta, caps)
        ln, pos = None, {}
    else:
        ln = pdr.law_need(b.geoms, ctx.loaded.law, r.target_loss)
        pos = {i: i for i in range(len(b.geoms))}
        at_q = {"d_need": ln.at_q, "reach": np.isfinite(ln.at_q), "c_need": 6.0 * b.geoms["n_act"].to_numpy(float) * ln.at_q}
        days = solve_inverse(b, ctx.keys, at_q, ctx.eta, caps, window=lambda k: pdr.windows(
            k[0], b.plans(*k), b.geoms, ln, ctx.eta[k], *ctx.peak(k)))
    pick = {k: int(np.argmin(days[k])) for k in ctx.keys}
    if ln is None and pdr.draws is not None:  # the point estimates: the draws of the geometries chosen only
        cols = sorted(set(pick.values()))
        ln, pos = pdr.law_need(b.geoms.iloc[cols], ctx.loaded.law, r.target_loss), {c: j for j, c in enumerate(cols)}
    out = {}
    for k, i in pick.items():
        t = float(days[k][i])
        if not np.isfinite(t) or t > caps[k] * (1 + 1e-9):
            out[k] = None
            continue
        row = _scored_row(ctx, k, i, t)
        p = _point(ctx, k, t, row, pdr.flags(k[0], row, nd["d_need"][i] / float(row["n_act"])))
        if ln is not None:
            dk = pdr.days(k[0], row.to_frame().T, ln.tokens[:, [pos[i]]], ctx.eta[k], *ctx.peak(k))[:, 0]
            p.update(pp.reach_fields(dk, t, r.max_days))
        out[k] = p
    return out


def spec_points(ctx: Context) -> dict:
    """Per key, the window the spec's model needs for --tokens under its best layout (eq:Dstar solved for T; at
    --confidence, the window it finishes in within that share of the draws)."""
    import pandas as pd

    from scaleplan.emit import geometry_dict
    from scaleplan.estimator.plans import PlanConstraints
    from scaleplan.mosaic.evidence import errors_for
    from scaleplan.mosaic.search import _plan_row
    from scaleplan.specs import load_spec

    r, pdr = ctx.r, ctx.pd
    spec = load_spec(r.spec)
    d = spec.data
    stack = _spec_stack(r, spec)
    cons = PlanConstraints(mbs=r.search.mbs, ckpt=ctx.bank.constraints.ckpt, mem_fraction=r.search.mem_fraction)
    out = {}
    for k in ctx.keys:
        est = ctx.ests[k[0]].for_stack(stack, spec.model.precision)
        res = est.best_plans([spec.model], ctx.n_dev(k), d.gbs, d.seqlen, spec.optimizer.optimizer_type, cons)[0]
        if res is None:
            out[k] = None
            continue
        row = pd.Series({**_plan_row(res, errors_for(est)), "n_act": res.n_act, "n_tot": res.n_tot})
        t = r.tokens / (res.tokens_per_s * ctx.eta[k]) / SECONDS_PER_DAY
        dk = None
        if pdr.draws is not None:
            tokens = np.full((pdr.draws.n, 1), float(r.tokens))
            dk = pdr.days(k[0], row.to_frame().T, tokens, ctx.eta[k], *ctx.peak(k))[:, 0]
            t = float(pdr.quantile(dk)) if pdr.confidence is not None else t
        p = _point(ctx, k, t)
        p["plan"] = {"model": str(r.spec), "tokens_per_s": res.tokens_per_s, "mfu": res.mfu,
                     "mem_per_device_gb": res.mem_per_device_gb, "layout": res.layout, "n_act": res.n_act,
                     "n_tot": res.n_tot, "d_tokens": r.tokens, "analytic_share": row["analytic_share"],
                     "evidence_sigma": row["evidence_sigma"],
                     "analytic_components": [c for c in str(row["analytic"] or "").split(",") if c],
                     "geometry": geometry_dict(spec.model)}
        _add_flags(p, pdr.flags(k[0], row, None))
        if dk is not None:
            p.update(pp.reach_fields(dk, t, r.max_days))
        out[k] = p
    return out


def forward_points(ctx: Context) -> dict:
    """Per key, the lowest loss its constraint window buys (the forward question; at --confidence, the loss
    reached in that share of the draws) and that window's optimum."""
    from scaleplan.mosaic.inverse import solve_forward

    pdr, b = ctx.pd, ctx.bank
    days = {k: ctx.window(k) for k in ctx.keys}
    at_q = None if pdr.confidence is None else (
        lambda k, d_ub: pdr.loss_bound(b.geoms, d_ub),
        lambda k, t: pdr.window_losses(k[0], t, days[k], ctx.eta[k], *ctx.peak(k)))
    tables = solve_forward(b, ctx.keys, days, ctx.eta, ctx.loaded.law, ctx.loaded.support, ctx.env, at_q)
    out = {}
    for k, t in tables.items():
        f = t[t.feasible & np.isfinite(t["loss_q"] if at_q else t["loss"])]
        if f.empty:
            out[k] = None
            continue
        row = f.sort_values(["loss_q" if at_q else "loss", "c_model"], ascending=[True, False], kind="stable").iloc[0]
        p = _point(ctx, k, days[k], row, pdr.flags(k[0], row, float(row["tpp"])))
        if at_q:
            p["loss_q"] = float(row["loss_q"])
        if pdr.draws is not None:
            loss, ok = pdr.losses(k[0], row.to_frame().T, days[k], ctx.eta[k], *ctx.peak(k))
            p.update(pp.loss_fields(loss[:, 0], ok[:, 0]))
        out[k] = p
    return out


# ------------------------------------------------------------------------------------------ the answer

def answer(ctx: Context) -> dict:
    """The plan JSON before its counts and launchable outputs (see :func:`platform_json`); raises SpecError
    (one line) for a target no platform reaches within the constraints."""
    r = ctx.r
    windows = any(w is not None for w in (r.max_days, r.max_gpu_hours, r.max_cost))
    pts = spec_points(ctx) if r.spec else target_points(ctx) if r.target_loss else {}
    fwd = forward_points(ctx) if windows and r.spec is None else {}
    plats = [platform_json(ctx, name, pts, fwd) for name in r.platforms]
    out = {"question": question(r), "law": ctx.loaded.source, "law_support": ctx.loaded.support.to_dict(),
           "goodput": {**r.goodput.describe(), "eta_good": {f"{k[0]}@{k[1]}": ctx.eta[k] for k in ctx.keys}},
           "samples": ctx.r.search.samples, "confidence": r.confidence, "planned_to": planned_to(r),
           "platforms": plats, "overall": overall(plats)}
    if (r.spec or r.target_loss) and not any(p["frontier"] for p in plats):
        raise unreachable(ctx, fwd)
    return out


def question(r) -> dict:
    """The target and the constraints as asked."""
    target = ({"loss": r.target_loss} if r.target_loss else
              {"spec": str(r.spec), "tokens": r.tokens} if r.spec else None)
    return {"target": target, "max_days": r.max_days, "max_gpu_hours": r.max_gpu_hours, "max_cost_usd": r.max_cost,
            "platforms": list(r.platforms), "pick": r.pick, "confidence": r.confidence}


def planned_to(r) -> str:
    """What the windows, losses and refusals are computed at, in words."""
    if r.confidence is None:
        return "the point estimates (P(reach) near 50% by construction; --confidence Q plans to a quantile)"
    return (f"a confidence of {r.confidence:.0%}: each window is reached, each loss reached or beaten, in at least "
            f"{r.confidence:.0%} of {r.search.samples} draws of the law and the MFU error")


def evidence_json(ctx: Context, name: str) -> dict:
    """Which components of ``name``'s time model read measured tables and which are analytic, and its MFU error."""
    est = ctx.ests[name]
    n, scaled = est.tables.n_points, est.tables.scaled_from  # scaled: another part's rows (composed)
    tables = {k: (f"composed ({v} points of {scaled[k]}, scaled to this part)" if k in scaled else
                  f"measured ({v} points)" if v else "analytic") for k, v in n.items()}
    return {"tables": tables, "measured": sorted(k for k, v in n.items() if v and k not in scaled),
            "composed": sorted(k for k in n if k in scaled),
            "analytic": sorted(k for k, v in n.items() if not v), "analytic_platform": not any(n.values()),
            "dispatch_law": str(getattr(est.dispatch, "source", "")), "mfu_error": ctx.sigma[name].to_dict(),
            "observed_runs": ctx.pd.runs[name].to_dict()}


def platform_json(ctx: Context, name: str, pts: dict, fwd: dict) -> dict:
    """One platform: its hardware, price, evidence; per node count its point (or why none); the cheapest,
    fastest and frontier within the constraints; the forward question's points and best."""
    prof = ctx.profs[name]
    keys = [k for k in ctx.keys if k[0] == name]
    points = [pts.get(k) or _missing(ctx, k) for k in keys] if pts else []
    within = [p for p in points if p.get("plan") and not p["violates"]]
    fw = [fwd[k] for k in keys if fwd.get(k)]
    return {"profile": name, "gpu_name": prof.gpu_name, "gpus_per_node": prof.gpus_per_node,
            "scaleup_domain": prof.scaleup_domain, "peak_bf16_flops": prof.peak("bf16"),
            "price": ctx.prices[name], "evidence": evidence_json(ctx, name), "nodes": [k[1] for k in keys],
            "points": points, "cheapest": pp.cheapest(within), "fastest": pp.fastest(within),
            "frontier": pp.frontier(within), "forward": fw,
            "best_loss": min(fw, key=pp.fwd_loss, default=None)}


def _missing(ctx: Context, key) -> dict:
    cap = ctx.window(key)
    at = "" if ctx.r.confidence is None else f" in {ctx.r.confidence:.0%} of the draws"
    why = (f"none within the constraints ({cap:.4g} days)" if np.isfinite(cap) else
           f"no geometry reaches it here (memory, or the law within --tpp-max{at})")
    return {"profile": key[0], "nodes": key[1], "n_devices": ctx.n_dev(key), "days": None,
            "eta_good": float(ctx.eta[key]), "why": why}


def overall(plats: list[dict]) -> dict:
    """Across platforms: the cheapest and fastest within the constraints (by cost where every platform with a
    point has a price, else by GPU-hours, said in ``by``), and the lowest loss of the forward question."""
    cands = [p for pl in plats for p in pl["frontier"]]
    priced = all(p["cost_usd"] is not None for p in cands)
    by = (lambda p: (p["cost_usd"], p["days"])) if priced else (lambda p: (p["gpu_hours"], p["days"]))
    fw = [pl["best_loss"] for pl in plats if pl["best_loss"]]
    return {"by": "cost" if priced else "gpu-hours", "cheapest": min(cands, key=by, default=None),
            "fastest": min(cands, key=lambda p: (p["days"], by(p)), default=None),
            "best_loss": min(fw, key=pp.fwd_loss, default=None)}


def unreachable(ctx: Context, fwd: dict) -> SpecError:
    """The one-line refusal: which constraint binds and the best reachable within the constraints."""
    r = ctx.r
    field, value = ("--target-loss", r.target_loss) if r.target_loss else ("--tokens", r.tokens)
    free = target_points(ctx, {k: np.inf for k in ctx.keys}) if r.target_loss else spec_points(ctx)
    pts = [p for p in free.values() if p]
    if not pts:
        return SpecError(field, value, "unreachable on every platform and node count: " + _nothing_reaches(ctx))
    fast, cheap = pp.fastest(pts), pp.cheapest(pts)
    parts = []
    if all("deadline" in p["violates"] for p in pts):
        parts.append(f"the deadline binds (--max-days {r.max_days:g}; the fastest plan needs {fast['days']:.3g} days "
                     f"on {fast['nodes']} x {fast['profile']})")
    if all(set(p["violates"]) & {"gpu-hours", "cost"} for p in pts):
        timely = [p for p in pts if "deadline" not in p["violates"]]
        cheap = pp.cheapest(timely) or cheap
        what = (f"${cheap['cost_usd']:,.0f}" if "cost" in cheap["violates"] else
                f"{cheap['gpu_hours']:,.0f} GPU-hours")
        parts.append(f"the budget binds (the cheapest plan{' within the deadline' if timely and r.max_days else ''} "
                     f"needs {what} on {cheap['nodes']} x {cheap['profile']})")
    if not parts:
        parts.append(f"the deadline and the budget together bind (the fastest needs {fast['days']:.3g} days, the "
                     f"cheapest {pp.cost_key(cheap):,.0f} {'USD' if cheap['cost_usd'] is not None else 'GPU-hours'})")
    return SpecError(field, value, "unreachable within the constraints: " + "; ".join(parts) + _best_within(ctx, fwd))


def _best_within(ctx: Context, fwd: dict) -> str:
    """What the constraints do buy (at the confidence, where one was asked)."""
    at = "" if ctx.r.confidence is None else f" in {ctx.r.confidence:.0%} of the draws"
    if ctx.r.spec is not None:  # days scale as 1 / tokens: a window W trains tokens x W / (its days) at the same P
        best = max(((k, ctx.r.tokens * ctx.window(k) / p["days"]) for k, p in spec_points(ctx).items() if p),
                   key=lambda t: t[1], default=None)
        return "" if best is None else (f"; the most tokens within them{at}: {best[1]:.3g} on {best[0][1]} x "
                                        f"{best[0][0]} in {ctx.window(best[0]):.3g} days")
    best = min((p for p in fwd.values() if p), key=pp.fwd_loss, default=None)
    return "" if best is None else (f"; the best loss reachable within them{at} is {pp.fwd_loss(best):.4f} "
                                    f"({best['nodes']} x {best['profile']}, {best['days']:.3g} days)")


def _nothing_reaches(ctx: Context) -> str:
    """Why no (platform, nodes) reaches the target: the law (no geometry of the grid within --tpp-max, at the
    confidence where one was asked), or memory (those that could have no plan that fits on these node counts); a
    fixed model: no plan fits."""
    if ctx.r.spec is not None:
        return "no plan of the model fits on these node counts (memory: more nodes, or --mem-fraction)"
    g, s = ctx.bank.geoms, ctx.r.search
    n_act = g["n_act"].to_numpy(float)
    if ctx.r.confidence is None:
        floor = float(np.min(ctx.loaded.law(g["n_tot"].to_numpy(float), g["s"].to_numpy(float), s.tpp_max * n_act,
                                            g["g"].to_numpy(float))))
        at = ""
    else:
        floor, at = ctx.pd.lowest_loss(g), f" in {ctx.r.confidence:.0%} of the draws"
    if floor < ctx.r.target_loss:
        return (f"no geometry that reaches it (the grid's lowest loss at TPP {s.tpp_max:g}{at} is {floor:.4f}) has a "
                "plan that fits on these node counts (memory: more nodes or --max-gpus, or --mem-fraction)")
    return (f"the law's range binds (the lowest loss any geometry of the grid reaches at TPP {s.tpp_max:g}{at} is "
            f"{floor:.4f}; a larger --q, --experts or --tpp-max)")


# ------------------------------------------------------------------------------------------ the chosen point

def chosen(out: dict, r) -> dict | None:
    """The point --pick names: the overall cheapest or fastest within the constraints (the forward question's
    lowest loss when there is no target), or PROFILE@NODES's point. Raises SpecError when it has no plan."""
    from scaleplan.mosaic.plan import _parse_pick

    o = out["overall"]
    if r.pick in ("cheapest", "fastest"):
        return o[r.pick] or o["best_loss"]
    name, nodes = _parse_pick(r.pick, r)
    pl = next(p for p in out["platforms"] if p["profile"] == name)
    got = next((p for p in pl["points"] + pl["forward"] if p["nodes"] == nodes and p.get("plan")), None)
    if got is None:
        raise SpecError("--pick", r.pick, f"a point with a plan ({name} on {nodes} nodes has none)")
    return got


def launch_outputs(ctx: Context, out: dict, point: dict | None) -> None:
    """--emit-spec / --emit megatron of the chosen point (the search's own outputs code), --html."""
    r = ctx.r
    out["chosen"] = point
    if (r.emit or r.emit_spec) and (point is None or not point.get("plan")):
        raise SpecError("--emit/--emit-spec", "no point", "a question with an answer within the constraints")
    if point is not None and (r.emit or r.emit_spec):
        if r.spec is not None:
            _emit_fixed_model(ctx, out, point)
        else:
            from scaleplan.mosaic.outputs import add_launch_outputs

            key = (point["profile"], point["nodes"])
            env = Envelope(nodes=point["nodes"], days=point["days"], goodput=point["eta_good"], gbs=ctx.env.gbs,
                           seqlen=ctx.env.seqlen, optimizer=ctx.env.optimizer, tpp_min=ctx.env.tpp_min,
                           tpp_max=ctx.env.tpp_max)
            doc = {"best": point["plan"]}
            add_launch_outputs(doc, SimpleNamespace(n_devices=ctx.n_dev(key)), ctx.grid, ctx.ests[key[0]], env,
                               r.search.mem_fraction, r.emit, r.emit_spec, None)
            out.update({k: doc[k] for k in ("megatron_args", "emitted_spec") if k in doc})
            out["provenance"] = doc["provenance"]
    if r.html:
        from scaleplan.report.html import write_report

        write_report(r.html, "plan", out)
        out["html"] = str(r.html)


def _spec_stack(r, spec):
    """The training stack a --spec target is planned on: --stack over the spec's own stack block (as estimate
    reads them; the request holds --stack already applied over the spec's)."""
    return r.search.stack or spec.stack


def _emit_fixed_model(ctx: Context, out: dict, point: dict) -> None:
    """--emit-spec / --emit megatron of a spec target: the spec's model under the chosen point's layout."""
    from scaleplan.emit import spec_document, write_spec
    from scaleplan.megatron.args import megatron_text
    from scaleplan.specs import load_spec, parse_spec

    r = ctx.r
    spec = load_spec(r.spec)
    doc = spec_document(spec.model, point["plan"]["layout"], gbs=spec.data.gbs, seqlen=spec.data.seqlen,
                        optimizer=spec.optimizer.optimizer_type, node_type=point["profile"],
                        n_devices=point["n_devices"], stack=_spec_stack(r, spec))
    what = f"{r.spec} on {pp.label(point)}: predicted MFU {100 * point['plan']['mfu']:.2f}%, {r.tokens:.4g} tokens"
    if r.emit == "megatron":
        out["megatron_args"] = megatron_text(parse_spec(doc), point["plan"]["layout"], point["n_devices"],
                                             ctx.profs[point["profile"]].gpus_per_node, what, r.tokens)
    if r.emit_spec:
        write_spec(r.emit_spec, doc, f"scaleplan plan: {what}\nestimate it with: scaleplan estimate {r.emit_spec}")
        out["emitted_spec"] = str(r.emit_spec)
