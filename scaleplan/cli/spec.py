"""`scaleplan spec`: write a spec from a Hugging Face config (``from-hf``), list and show the catalogue's models and
the published runs (``published``).

Never imports torch (planner command).
"""
from __future__ import annotations

from pathlib import Path

import typer

from scaleplan.cli._common import JsonOpt, print_json, stderr, stdout, want_json
from scaleplan.errors import SpecError

app = typer.Typer(no_args_is_help=True, add_completion=False)


def _write(doc: dict, out: Path | None, header: str) -> None:
    from scaleplan.emit import spec_text, write_spec

    if out is None:
        stdout.print(spec_text(doc, header), end="", markup=False, highlight=False, soft_wrap=True)
        return
    write_spec(out, doc, header, flag="--output")  # read back before it is reported
    stderr.print(f"wrote {out}", highlight=False, markup=False)


@app.command("from-hf")
def from_hf(
    config: Path = typer.Argument(..., metavar="CONFIG", help="A Hugging Face config.json, or a model directory "
                                  "holding one (DeepSeek-V3/Kimi-K2, Qwen3-MoE, GPT-OSS, Mixtral, OLMoE families)."),
    output: Path = typer.Option(None, "--output", "-o", help="Write the spec here (default: stdout)."),
    gbs: int = typer.Option(1024, "--gbs", help="Global batch in sequences (the config has none)."),
    seqlen: int = typer.Option(4096, "--seqlen", help="Tokens per sequence (the config has none)."),
    profile: str = typer.Option("p6-b200.48xlarge", "--profile", help="Cluster profile (hardware.node_type)."),
) -> None:
    """A spec YAML from a Hugging Face config: every key read, checked, or known not to change the plan; an
    unknown key or model_type is a one-line error naming it."""
    from scaleplan.hf_config import read_config, spec_from_hf

    for flag, v in (("--gbs", gbs), ("--seqlen", seqlen)):
        if v <= 0:
            raise SpecError(flag, v, "a positive integer")
    data, where = read_config(config)
    doc = spec_from_hf(data, where, gbs=gbs, seqlen=seqlen, node_type=profile)
    _write(doc, output, f"written by `scaleplan spec from-hf {config}`: the model from {where}; data, optimizer, "
           "precision\nand hardware are planning defaults (a config says nothing of the run)")


def _counts(spec) -> dict:
    from scaleplan.geometry import spec_param_counts

    pc = spec_param_counts(spec.model)
    return {"n_tot": pc.n_tot, "n_act": pc.n_act, "embedding": pc.embedding, "mtp": pc.mtp,
            "total_with_embedding": pc.n_tot + pc.embedding}


@app.command("list")
def list_(json_out: bool = JsonOpt) -> None:
    """The catalogue's models (usable by name wherever a spec file is accepted) with their parameter counts."""
    from scaleplan import catalogue
    from scaleplan.specs import parse_spec

    rows = []
    for n in catalogue.names():
        e = catalogue.entry(n)
        rows.append({"name": n, "title": e["title"], **_counts(parse_spec(e["spec"], source=n)),
                     "sources": e["sources"]})
    if want_json(json_out):
        print_json({"models": rows})
        return
    from rich.table import Table

    t = Table(title="catalogue (scaleplan spec show NAME for the spec and its sources)")
    for c in ("name", "model", "total (B, with embeddings)", "N_tot (B)", "N_act (B)", "MTP (B)"):
        t.add_column(c)
    for r in rows:
        t.add_row(r["name"], r["title"], f"{r['total_with_embedding'] / 1e9:.2f}", f"{r['n_tot'] / 1e9:.2f}",
                  f"{r['n_act'] / 1e9:.2f}", f"{r['mtp'] / 1e9:.2f}" if r["mtp"] else "-")
    stdout.print(t)


@app.command("show")
def show(name: str = typer.Argument(..., metavar="NAME", help="A catalogue model name or alias."),
         json_out: bool = JsonOpt) -> None:
    """One catalogue entry: its spec (ready for --emit-spec style editing) and where its figures come from."""
    from scaleplan import catalogue

    if catalogue.resolve(name) is None:
        raise SpecError("NAME", name, f"one of {', '.join(catalogue.names())}")
    e = catalogue.entry(name)
    if want_json(json_out):
        print_json(e)
        return
    header = f"{e['title']}: " + "\n".join(f"{k}: {v}" for k, v in e["sources"].items())
    _write(e["spec"], None, header)


@app.command("published")
def published_(name: str = typer.Argument(None, metavar="[ID]", help="A published run's id: print its spec."),
               model: str = typer.Option(None, "--model", help="Only the runs of this catalogue model (name or "
                                         "alias)."),
               json_out: bool = JsonOpt) -> None:
    """Published training runs of the catalogue's models (each usable as a spec by its id): the system, devices,
    layout and stack each ran and the step time its publisher measured; with an ID, that run's spec."""
    from scaleplan import catalogue, published

    if name is not None:
        run = published.find(name)
        if run is None:
            raise SpecError("ID", name, "a published run's id (scaleplan spec published lists them)")
        if want_json(json_out):
            print_json({**_run_row(run), "spec": run.doc})
            return
        import textwrap

        about = "\n".join(textwrap.fill(p, 110) for p in dict(published.groups())[run.group].splitlines())
        _write(run.doc, None, f"{run.name}: {run.group}; measured {_step(run)}\n{about}")
        return
    runs = published.runs()
    if model is not None:
        if catalogue.resolve(model) is None:
            raise SpecError("--model", model, f"one of {', '.join(catalogue.names())}")
        runs = [r for r in runs if r.model == catalogue.resolve(model)]
    rows = [_run_row(r) for r in runs]
    if want_json(json_out):
        print_json({"runs": rows, "groups": [{"label": g, "about": a} for g, a in published.groups()]})
        return
    from rich.table import Table

    t = Table(title="published runs (scaleplan spec published ID for a run's spec; scaleplan estimate ID to predict it)")
    for c in ("id", "system", "devices", "layout", "measured step (s)"):
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(r["id"], r["system"], str(r["devices"]), r["layout"],
                  "-" if r["published_step_s"] is None else f"{r['published_step_s']:.2f}")
    stdout.print(t)


def _run_row(run) -> dict:
    from scaleplan.cli.estimate import layout_arg

    lay = layout_arg(run.layout)  # as --layout reads it
    return {"id": run.id, "name": run.name, "group": run.group, "model": run.model, "system": run.system,
            "devices": run.devices, "layout": lay, "published_step_s": run.published_step_s}


def _step(run) -> str:
    return "no published figure (a comparison run)" if run.published_step_s is None else \
        f"{run.published_step_s:.3f} s per step"
