"""Observed training runs: parse CSV/JSON rows into ObservedRun records and store them idempotently.

An observation is one parallel layout of one model actually trained: the spec (JSON), the layout,
the device count, global batch and sequence length, and what was measured. **The measured step
time is the truth** (seconds per optimizer step): every comparison the calibration, the report and
the benchmarks make is in step time. A run gives it directly, or as an MFU together with the FLOP
count the MFU was logged in (``--mfu-flops``, calibrate/flops.py COUNTS: '6n', 'eq-mfu',
'megatron'), from which the step time is derived at import (eq:mfu solved for t_iter on the
profile's peak). An MFU with no declared count is refused unless the row also has its step time
(then the MFU is not kept: without its count it says nothing the step time does not). Only the MFU
normalised within its sweep (ratios only, section sec:perf-validation) needs no count: within one
model the ratios are inverse step-time ratios. Peak memory (GB = 1e9 bytes) when known.

CSV columns (header names; one row per run; the layout columns follow
``shared/validation/mfu_sweeps.csv``):

=====================  ========  =============================================================
column                 required  meaning
=====================  ========  =============================================================
sweep                  no        sweep name (same model, devices, global batch); default: file stem
model | spec           yes       a key of ``--specs`` (model) or a path to a spec YAML (spec)
n_devices              yes       number of GPUs
gbs, seqlen            yes       global batch (sequences), tokens per sequence
tp, cp, pp, ep, dp     yes       the layout; tp*cp*pp*dp = n_devices, ep divides dp
mbs                    yes       micro-batch size
ckpt, vpp, etp         no        recompute mode (default: the spec's), VPP (1), ETP (the spec's)
measured_t_iter_s      one of    measured seconds per optimizer step (real_step_s_est too)
measured_mfu | mfu_pct   these   measured MFU as a fraction | in percent (real_mfu_pct_est too);
                                 needs ``--mfu-flops`` (or a ``mfu_flops`` column) unless the row
                                 has its step time
mfu_norm               three     MFU / the sweep's maximum (real_mfu_norm too)
mfu_flops              no        the FLOP count of this row's MFU (overrides ``--mfu-flops``)
peak_mem_gb            no        measured peak memory per device, GB
reference_mfu(_pct)    no        a peer estimator's predicted MFU (reference_pred_mfu_pct too)
reference_step_s       no        a peer estimator's predicted step time (reference_pred_step_s too)
=====================  ========  =============================================================

A JSON file holding a list of such records (or ``{"runs": [...]}``, e.g. saved ``scaleplan
validate --json`` results flattened to these keys) is accepted too. Runs that ``scaleplan
validate`` performed are stored by it directly, with source 'validate'. Programs that read a run
some other way (a training log) build :class:`Observation` with ``measured_t_iter_s`` and call
:func:`store_observations`.

Import is atomic: the first bad row raises :class:`SpecError` naming the row and column and
nothing is written. Re-importing the same rows adds nothing (``dedup_key``).
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml
from sqlalchemy import select

from scaleplan.errors import ScaleplanError, SpecError
from scaleplan.estimator.model_dims import geometry
from scaleplan.estimator.layout import FIELDS, LayoutContext, ParallelLayout
from scaleplan.specs import CKPT_MODES, Layout, Spec, load_spec, parse_spec
from scaleplan.yamlio import load_yaml

# the layout columns but etp, vpp and ckpt, which default to the spec's (expert_tp_degree, 1, its ckpt mode)
REQUIRED = ("n_devices", "gbs", "seqlen", *(f for f in FIELDS if f not in ("etp", "vpp", "ckpt")))
OPTIONAL_INT = ("vpp", "etp")
# column aliases -> canonical name (mfu_sweeps.csv names on the left)
ALIASES = {
    "real_mfu_pct_est": "mfu_pct",
    "real_step_s_est": "measured_t_iter_s",
    "reference_pred_step_s": "reference_step_s",
    "real_mfu_norm": "mfu_norm",
    "measured_mfu_norm": "mfu_norm",
    "reference_pred_mfu_pct": "reference_mfu_pct",
    "reference_pred_mfu_norm": "reference_mfu_norm",
    "peak_mem": "peak_mem_gb",
    "measured_peak_mem_gb": "peak_mem_gb",
}


@dataclass
class Observation:
    """One observed run, ready to store (field names follow the ObservedRun columns)."""

    sweep: str
    model_name: str | None
    spec: dict[str, Any]
    profile: str
    n_devices: int
    gbs: int
    seqlen: int
    layout: dict[str, Any]
    measured_t_iter_s: float | None = None
    measured_mfu: float | None = None
    mfu_flops: str | None = None  # the FLOP count of measured_mfu (calibrate/flops.py COUNTS)
    measured_mfu_norm: float | None = None
    measured_peak_mem_gb: float | None = None
    reference_mfu: float | None = None
    source: str = "csv"
    extra: dict[str, Any] = field(default_factory=dict)

    def dedup_key(self) -> str:
        """sha256 over what the run *is* and what was measured (not where it was imported from)."""
        ident = {k: getattr(self, k) for k in ("sweep", "spec", "profile", "n_devices", "gbs", "seqlen", "layout",
                                               "measured_t_iter_s", "measured_mfu", "measured_mfu_norm",
                                               "measured_peak_mem_gb")}
        if self.mfu_flops is not None:  # older rows (no count) keep their key
            ident["mfu_flops"] = self.mfu_flops
        blob = json.dumps(ident, sort_keys=True, default=_round_float)
        return hashlib.sha256(blob.encode()).hexdigest()

    def to_row(self) -> dict[str, Any]:
        lay = self.layout
        return dict(dedup_key=self.dedup_key(), source=self.source, sweep=self.sweep, model_name=self.model_name,
                    spec=self.spec, profile=self.profile, n_devices=self.n_devices, gbs=self.gbs,
                    seqlen=self.seqlen, **{f: lay[f] for f in FIELDS},
                    measured_t_iter_s=self.measured_t_iter_s, measured_mfu=self.measured_mfu,
                    mfu_flops=self.mfu_flops, measured_mfu_norm=self.measured_mfu_norm,
                    measured_peak_mem_gb=self.measured_peak_mem_gb,
                    reference_mfu=self.reference_mfu, extra=self.extra or None)


def _round_float(o: Any) -> Any:
    return repr(o)


# --- reading ---------------------------------------------------------------------------------------

def read_table(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a CSV or JSON observations file as dicts (column names lower-cased, aliases resolved)."""
    p = Path(path)
    try:
        if p.suffix.lower() == ".json":
            data = json.loads(p.read_text())
            records = data.get("runs", data) if isinstance(data, dict) else data
            if not isinstance(records, list):
                raise SpecError(str(p), type(records).__name__, "a JSON list of run records or {\"runs\": [...]}")
            df = pd.DataFrame.from_records(records)
        else:
            df = pd.read_csv(p, skipinitialspace=True, comment=None)
    except OSError as e:
        raise SpecError("runs file", str(path), f"a readable CSV or JSON file ({e.strerror})") from None
    except (ValueError, pd.errors.ParserError) as e:
        raise SpecError("runs file", str(path), f"a valid CSV/JSON file ({str(e).splitlines()[0]})") from None
    df.columns = [ALIASES.get(str(c).strip().lower(), str(c).strip().lower()) for c in df.columns]
    return [{k: (None if _missing(v) else v) for k, v in rec.items()} for rec in df.to_dict("records")]


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or (isinstance(v, str) and not v.strip())


def load_specs_file(path: str | Path | None) -> dict[str, Spec]:
    """``models.yaml``: a mapping model key -> spec mapping (each validated). Raises SpecError."""
    if path is None:
        return {}
    p = Path(path)
    try:
        data = load_yaml(p.read_text())
    except OSError as e:
        raise SpecError("--specs", str(path), f"a readable YAML file ({e.strerror})") from None
    except yaml.YAMLError:
        raise SpecError("--specs", str(path), "valid YAML: a mapping of model name -> spec") from None
    if not isinstance(data, dict):
        raise SpecError("--specs", str(path), "a YAML mapping of model name -> spec")
    out = {}
    for key, body in data.items():
        try:
            out[str(key)] = parse_spec(body, source=f"{path}:{key}")
        except SpecError as e:
            raise SpecError(f"--specs {key}.{e.field}", e.value, e.allowed) from None
    return out


# --- converting rows -------------------------------------------------------------------------------

class _Row:
    """Typed access to one record with errors that name the row and column."""

    def __init__(self, rec: dict[str, Any], where: str):
        self.rec, self.where = rec, where

    def err(self, col: str, value: Any, allowed: str) -> SpecError:
        return SpecError(f"{self.where} column {col}", value, allowed)

    def int_(self, col: str, default: int | None = None) -> int:
        v = self.rec.get(col)
        if v is None:
            if default is None:
                raise self.err(col, None, "this column is required")
            return default
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise self.err(col, v, "a positive integer") from None
        if not f.is_integer() or f <= 0 or f >= 2**63:  # 2**63: the int64 arrays of ParallelLayout
            raise self.err(col, v, "a positive integer below 2**63")
        return int(f)

    def float_(self, col: str, lo: float = 0.0, hi: float = math.inf, unit: str = "") -> float | None:
        v = self.rec.get(col)
        if v is None:
            return None
        allowed = f"a finite number > {lo:g}{unit}" if math.isinf(hi) else f"a number in ({lo:g}, {hi:g}]{unit}"
        try:
            f = float(v)
        except (TypeError, ValueError):
            raise self.err(col, v, allowed) from None
        if not (math.isfinite(f) and lo < f <= hi):
            raise self.err(col, v, allowed)
        return f


def _resolve_spec(row: _Row, specs: dict[str, Spec], base_dir: Path, cache: dict[str, Spec]) -> tuple[Spec, str]:
    rec = row.rec
    if rec.get("spec") is not None:
        sp = Path(str(rec["spec"]))
        sp = sp if sp.is_absolute() else base_dir / sp
        key = str(sp)
        if key not in cache:
            try:
                cache[key] = load_spec(sp)
            except SpecError as e:
                raise row.err("spec", str(rec["spec"]), f"a valid spec YAML ({e})") from None
        return cache[key], sp.stem
    if rec.get("model") is not None:
        name = str(rec["model"])
        if name not in specs:
            known = ", ".join(sorted(specs)) or "none (pass --specs models.yaml)"
            raise row.err("model", name, f"a key of --specs; known: {known}")
        return specs[name], name
    raise row.err("model", None, "a 'model' (key of --specs) or 'spec' (YAML path) column is required")


def _measurement(row: _Row, spec: Spec, vals: dict[str, int], profile: str,
                 mfu_flops: str | None) -> tuple[float | None, float | None, str | None, float | None]:
    """(step time s, MFU, its FLOP count, MFU / sweep max) of one row: the step time as given, else
    derived from the MFU in its declared count (module docstring). Raises SpecError naming the column."""
    from scaleplan.calibrate.flops import COUNTS, flops_per_step, step_time_from_mfu
    from scaleplan.profiles import load_profile

    t_iter = row.float_("measured_t_iter_s", unit=" seconds")
    mfu = row.float_("measured_mfu", hi=1.0, unit=" (a fraction)")
    pct = row.float_("mfu_pct", hi=100.0, unit=" (percent)")
    if mfu is not None and pct is not None and not math.isclose(mfu, pct / 100, rel_tol=1e-6):
        raise row.err("mfu_pct", pct, f"consistent with measured_mfu = {mfu} (or give only one)")
    mfu = mfu if mfu is not None else (pct / 100 if pct is not None else None)
    norm = row.float_("mfu_norm", hi=1.0 + 1e-9, unit=" (MFU / the sweep's max)")
    count = str(row.rec["mfu_flops"]) if row.rec.get("mfu_flops") is not None else mfu_flops
    if count is not None and count not in COUNTS:
        raise row.err("mfu_flops", count, f"one of {', '.join(COUNTS)}")
    if t_iter is None and mfu is None and norm is None:
        raise row.err("measured_t_iter_s", None,
                      "one of measured_t_iter_s, measured_mfu, mfu_pct or mfu_norm is required")
    if mfu is not None and count is None:
        if t_iter is None:
            raise row.err("mfu_pct" if pct is not None else "measured_mfu", mfu,
                          "an MFU with its FLOP count: pass --mfu-flops 6n|eq-mfu|megatron, or give measured_t_iter_s")
        mfu = None  # the step time is the measurement; an MFU of unknown count adds nothing
    if mfu is not None and t_iter is None:
        flops = flops_per_step(spec.model, vals["gbs"], vals["seqlen"], count, vals["tp"])
        t_iter = step_time_from_mfu(mfu, flops, vals["n_devices"], load_profile(profile).peak(spec.model.precision))
    return t_iter, mfu, (count if mfu is not None else None), norm


def row_to_observation(rec: dict[str, Any], where: str, specs: dict[str, Spec], base_dir: Path,
                       default_sweep: str, profile: str | None, source: str,
                       cache: dict[str, Spec] | None = None, mfu_flops: str | None = None) -> Observation:
    """Validate one record and build its :class:`Observation`; ``mfu_flops``: the FLOP count of the
    file's MFU column (calibrate/flops.py). Raises SpecError naming row and column."""
    row = _Row(rec, where)
    spec, model_name = _resolve_spec(row, specs, base_dir, {} if cache is None else cache)
    vals = {c: row.int_(c) for c in REQUIRED}
    moe_etp = spec.model.moe.expert_tp_degree if spec.model.moe else 1
    vpp, etp = row.int_("vpp", 1), row.int_("etp", moe_etp)
    ckpt = str(rec.get("ckpt") or spec.performance.activation_checkpointing_type)
    if ckpt not in CKPT_MODES:
        raise row.err("ckpt", ckpt, f"one of {', '.join(CKPT_MODES)}")
    lay = ParallelLayout.of(**{f: vals[f] for f in FIELDS if f in vals}, etp=etp, vpp=vpp, ckpt=ckpt)
    bad = lay.violation(LayoutContext(geometry(spec.model), vals["n_devices"], vals["gbs"], vals["seqlen"],
                                      a2a_overlap=spec.stack.a2a_overlap))
    if bad is not None:  # the estimator's own rules: a row it could not estimate is refused here
        col, value, allowed = bad
        raise row.err("dp" if col == "mesh" else col, value, allowed)
    prof = profile or spec.hardware.node_type
    t_iter, mfu, count, norm = _measurement(row, spec, vals, prof, mfu_flops)
    ref = row.float_("reference_mfu", hi=1.0)
    ref_pct = row.float_("reference_mfu_pct", hi=100.0)
    ref = ref if ref is not None else (ref_pct / 100 if ref_pct is not None else None)
    extra = {}
    ref_norm = row.float_("reference_mfu_norm", hi=10.0)
    if ref_norm is not None:
        extra["reference_mfu_norm"] = ref_norm
    ref_t = row.float_("reference_step_s", unit=" seconds")
    if ref_t is not None:
        extra["reference_step_s"] = ref_t
    # the spec's data block carries this run's batch geometry, so the estimator sees the run itself
    spec_d = spec.model_dump(mode="json")
    spec_d["data"].update(gbs=vals["gbs"], seqlen=vals["seqlen"], microbatch_sz=vals["mbs"])
    spec_d["performance"]["activation_checkpointing_type"] = ckpt
    layout = lay.row(0)
    return Observation(sweep=str(rec.get("sweep") or default_sweep), model_name=model_name, spec=spec_d,
                       profile=prof, n_devices=vals["n_devices"], gbs=vals["gbs"],
                       seqlen=vals["seqlen"], layout=layout, measured_t_iter_s=t_iter, measured_mfu=mfu,
                       mfu_flops=count, measured_mfu_norm=norm,
                       measured_peak_mem_gb=row.float_("peak_mem_gb", unit=" GB"),
                       reference_mfu=ref, source=source, extra=extra)


def parse_runs_file(path: str | Path, specs_path: str | Path | None = None, profile: str | None = None,
                    source: str | None = None, mfu_flops: str | None = None) -> list[Observation]:
    """All observations of a CSV/JSON file; raises SpecError on the first bad row (nothing is kept).
    ``mfu_flops``: the FLOP count of the file's MFU column (calibrate/flops.py COUNTS)."""
    p = Path(path)
    specs = load_specs_file(specs_path)
    if profile is not None:
        from scaleplan.profiles import profile_names

        if profile not in profile_names():
            raise SpecError("--profile", profile, f"one of {', '.join(profile_names())}")
    records = read_table(p)
    if not records:
        raise ScaleplanError(f"{p}: no rows")
    cache: dict[str, Spec] = {}
    return [row_to_observation(rec, f"{p.name}: row {i + 1}", specs, p.parent, p.stem, profile,
                               source or f"csv:{p.name}", cache, mfu_flops)
            for i, rec in enumerate(records)]



def sweeps_of(path: str | Path, specs_path: str | Path | None = None,
              mfu_flops: str | None = None) -> list[tuple[str, Spec, int, list[Layout], list[Observation]]]:
    """The runs of a file grouped by sweep, in file order: (sweep, Spec, n_devices, layouts, observations).

    One sweep shares its model, device count and batch (as in ../shared/validation/mfu_sweeps.csv);
    the Spec is the first run's. Raises SpecError like :func:`parse_runs_file`.
    """
    groups: dict[str, list[Observation]] = {}
    for o in parse_runs_file(path, specs_path, mfu_flops=mfu_flops):
        groups.setdefault(o.sweep, []).append(o)
    return [(name, parse_spec(obs[0].spec), obs[0].n_devices, [Layout(**o.layout) for o in obs], obs)
            for name, obs in groups.items()]

# --- storing ---------------------------------------------------------------------------------------

def store_observations(sess, observations: list[Observation]) -> int:
    """Insert observations not stored yet (by ``dedup_key``); returns the number inserted."""
    from scaleplan.db import models as m
    from scaleplan.db.importers import insert_points

    rows, seen = [], set()
    for o in observations:
        r = o.to_row()
        if r["dedup_key"] in seen:
            continue
        seen.add(r["dedup_key"])
        rows.append(r)
    if not rows:
        return 0
    existing = set(sess.scalars(select(m.ObservedRun.dedup_key)
                                .where(m.ObservedRun.dedup_key.in_([r["dedup_key"] for r in rows]))))
    rows = [r for r in rows if r["dedup_key"] not in existing]
    if not rows:
        return 0
    return insert_points(sess, m.ObservedRun, rows)


def add_runs(url: str | None, path: str | Path, specs_path: str | Path | None = None,
             profile: str | None = None, mfu_flops: str | None = None) -> dict[str, Any]:
    """Parse ``path`` and store its observations in one transaction. Returns counts per sweep.
    ``mfu_flops``: the FLOP count of the file's MFU column (calibrate/flops.py COUNTS)."""
    from scaleplan.db import session as dbs

    obs = parse_runs_file(path, specs_path, profile, mfu_flops=mfu_flops)
    dbs.ensure_schema(url)

    def _go() -> int:
        with dbs.session_scope(url) as s:
            return store_observations(s, obs)

    inserted = dbs.with_retry(_go)
    read_back_observations(url, obs)
    sweeps: dict[str, int] = {}
    for o in obs:
        sweeps[o.sweep] = sweeps.get(o.sweep, 0) + 1
    return {"file": str(path), "rows": len(obs), "inserted": inserted, "already_present": len(obs) - inserted,
            "sweeps": sweeps, "profiles": sorted({o.profile for o in obs}),
            "step_time_from": {k: sum(1 for o in obs if _source_of_time(o) == k) for k in
                               sorted({_source_of_time(o) for o in obs})}}


def read_back_observations(url: str | None, obs: list[Observation]) -> None:
    """Every observation of ``obs`` is stored, as a new connection sees it (db.session.read_back by dedup key),
    before a command reports them stored. Raises ScaleplanError naming the missing keys."""
    from scaleplan.db import models as m
    from scaleplan.db.session import read_back

    read_back(url, m.ObservedRun, [o.to_row()["dedup_key"] for o in obs], key="dedup_key")


def _source_of_time(o: Observation) -> str:
    """Where a stored run's step time came from: 'given', 'mfu:<count>', or 'none' (ratios only)."""
    if o.mfu_flops is not None:
        return f"mfu:{o.mfu_flops}"
    return "given" if o.measured_t_iter_s is not None else "none"


def load_observed(sess, profile: str | None = None, sweeps: list[str] | None = None,
                  sources: list[str] | None = None) -> list:
    """ObservedRun rows (optionally one profile, some sweeps/sources), ordered by id."""
    from scaleplan.db import models as m

    q = select(m.ObservedRun).order_by(m.ObservedRun.id)
    if profile:
        q = q.where(m.ObservedRun.profile == profile)
    if sweeps:
        q = q.where(m.ObservedRun.sweep.in_(sweeps))
    if sources:
        q = q.where(m.ObservedRun.source.in_(sources))
    return list(sess.scalars(q))
