"""`scaleplan plan`: which cluster, window and platform reach a target loss (or train a model on D tokens), at
what cost; and the best loss a deadline or budget buys (scaleplan.mosaic.plan). Never imports torch.
"""
from __future__ import annotations

from pathlib import Path

import typer

from scaleplan.cli._common import CKPT_ALL, DbOpt, ExtrapOpt, JsonOpt, LawOpt, MemFractionOpt, StackOpt
from scaleplan.cli.estimate import EmitOpt, EmitSpecOpt, HtmlOpt
from scaleplan.mosaic.run import SearchRequest as D  # the search's defaults (the paper's envelope); a light import

_PLATFORMS = "p5.48xlarge,p5en.48xlarge,p6-b200.48xlarge,p6e-gb200.36xlarge"  # mosaic.plan.DEFAULT_PLATFORMS


def _csv(values: tuple) -> str:
    return ",".join(map(str, values))


def _opt(default, flag: str, text: str, **kw):
    return typer.Option(default, flag, help=text, **kw)


def plan(
    target_loss: float = _opt(None, "--target-loss", "Target: the loss (nats, the joint law of sec. 4) to reach."),
    spec: Path = _opt(None, "--spec", "Target: a model spec to train on --tokens (instead of a loss)."),
    tokens: float = _opt(None, "--tokens", "The token budget D of --spec's model."),
    platforms: str = _opt(_PLATFORMS, "--platforms", "Node types (cluster profiles) to compare."),
    nodes: list[str] = _opt(None, "--nodes", "Node counts: LIST for every platform, or PROFILE=LIST (repeatable). "
                            "Default: powers of two from 8 GPUs to --max-gpus."),
    max_gpus: int = _opt(1024, "--max-gpus", "Largest cluster of the default node counts (GPUs)."),
    max_days: float = _opt(None, "--max-days", "Deadline: the longest training window (days)."),
    max_gpu_hours: float = _opt(None, "--max-gpu-hours", "Budget in GPU-hours."),
    max_cost: float = _opt(None, "--max-cost", "Budget in USD (needs a price for every platform)."),
    price: list[str] = _opt(None, "--price", "USD per GPU-hour: PROFILE=USD[,PROFILE=USD] (repeatable); replaces "
                            "the profile's default (printed with its date and source)."),
    failure_rate: float = _opt(None, "--failure-rate", "Failures per GPU-hour (default 1.97e-5, Llama 3's)."),
    restart_min: float = _opt(None, "--restart-min", "Minutes from a failure to training again (default 10)."),
    ckpt_save_s: float = _opt(None, "--ckpt-save-s", "Seconds a checkpoint stalls training (default 10)."),
    ckpt_interval_min: float = _opt(None, "--ckpt-interval-min", "Checkpoint interval (default: Young's optimum)."),
    goodput: float = _opt(None, "--goodput", "A fixed eta_good instead of the failure model."),
    pick: str = _opt("cheapest", "--pick", "The point --emit/--emit-spec/--html single out: cheapest, fastest or "
                     "PROFILE@NODES."),
    q: str = _opt(_csv(D.q), "--q", "Ladder seeds q (L = 4q layers, d = 512q)."),
    experts: str = _opt(_csv(D.experts), "--experts", "Expert counts E."),
    topk: str = _opt(_csv(D.topk), "--topk", "Top-K values."),
    g: str = _opt(_csv(D.g), "--g", "Expert split factors G = d_ff / d_expert."),
    mbs: str = _opt(_csv(D.mbs), "--mbs", "Micro-batch sizes of the plan search."),
    ckpt: str = _opt(CKPT_ALL, "--ckpt", "Activation-checkpointing modes of the plan search."),
    gbs: int = _opt(D.gbs, "--gbs", "Global batch B_global (sequences)."),
    seqlen: int = _opt(D.seqlen, "--seqlen", "Sequence length T_seq (tokens)."),
    s_min: float = _opt(D.s_min, "--s-min", "Geometry guard: keep S >= s_min."),
    s_max: float = _opt(None, "--s-max", "Geometry guard: keep S <= s_max (default none)."),
    tpp_min: float = _opt(D.tpp_min, "--tpp-min", "Lowest tokens per active parameter (D/N_act)."),
    tpp_max: float = _opt(D.tpp_max, "--tpp-max", "Cap on tokens per active parameter."),
    optimizer: str = _opt(D.optimizer, "--optimizer", "Optimizer (memory of its states)."),
    samples: int = _opt(D.samples, "--samples", "Draws of the law's ridge and the MFU error for P(reaches target)."),
    confidence: float = _opt(None, "--confidence", "Plan to this probability (e.g. 0.9): every window reaches the "
                             "target, every loss is reached, in at least that share of the draws (default: the point "
                             "estimates)."),
    seed: int = _opt(D.seed, "--seed", "Random seed of the draws."),
    workers: int = _opt(D.workers, "--workers", "Processes for the plan search (0: the usable CPUs)."),
    calibration: str = _opt(None, "--calibration", "'none': chi_sys = 1 and each profile's dispatch law (default: "
                            "the newest calibration of each profile).", metavar="none"),
    mem_fraction: float = MemFractionOpt,
    extrapolate: str = ExtrapOpt,
    law_name: str = LawOpt,
    emit: str = EmitOpt,
    emit_spec: Path = EmitSpecOpt,
    html: Path = HtmlOpt,
    stack: str = StackOpt,
    db: str = DbOpt,
    json_out: bool = JsonOpt,
) -> None:
    """The cheapest and fastest cluster and window per platform that reach a target, with the frontier between."""
    from scaleplan.cli.plan_view import request, show
    from scaleplan.mosaic.plan import run_plan

    show(run_plan(request(dict(locals()))), json_out)
