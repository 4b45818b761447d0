"""The measurement rows a profile's tables are built from (estimator/table_build.py builds them): one
frame per bench suite, OK points of the runs of this profile's hardware only, plus the single-device rows
of the profiles it names in ``device_tables`` (same GPU model) for the kinds of rows it lacks, then those of its
``scaled_device_tables`` (another part of the same tensor-core generation) with their times scaled to this part
(:func:`scale_to_part`), and the intra-node collective rows of its ``fabric_tables`` (the same scale-up fabric)."""
from __future__ import annotations

from scaleplan.lazy import lazy_module

pd = lazy_module("pandas")

SUITE_TABLE = {"gemm": "gemm_point", "grouped_gemm": "grouped_gemm_point", "sdpa": "sdpa_point",
               "router": "router_point", "elementwise": "elementwise_point", "vocab": "vocab_point",
               "collectives": "collective_point", "dispatch": "dispatch_point",
               "allocator": "allocator_point"}

# The suites that measure one device alone (scaleplan.profiles.DeviceSuite), and the columns that tell one kind
# of row from another in each. A profile's ``device_tables`` lend their rows of a kind the profile has none of
# (or, in its ``device_tables_first`` suites, of every kind they hold): an 8-GPU node type whose own runs measured
# only dense GEMMs takes its grouped GEMMs, attention, router, element-wise, vocabulary and allocator rows from a
# single-GPU machine of the same GPU. Not lent: dispatch (the host CPU and driver set the launch gap) and
# collectives (the fabric).
DEVICE_SUITES = {"gemm": ("dtype",), "grouped_gemm": ("dtype",), "sdpa": ("backend", "dtype"),
                 "router": ("variant", "dtype"), "elementwise": ("op", "dtype"), "vocab": ("op", "dtype"),
                 "allocator": ()}
# the column naming the profile whose runs a row comes from (the profile itself or a lender)
FROM_PROFILE = "from_profile"
# the frame of the dense GEMM rows of the profile's ``fp8_ratio_tables`` (GPUs on the same die)
SAME_DIE_GEMM = "gemm_fp8_ratio"
# the profile fields naming other profiles whose rows a profile's tables may read, and how each is read (the table
# cache's key, db coverage, an answer's provenance)
BORROWED_ROWS = {"device_tables": "lent", "fp8_ratio_tables": "FP8 / bf16 ratio",
                 "scaled_device_tables": "scaled to this part", "fabric_tables": "lent"}
# the columns that tell one kind of collective row from another; a ``fabric_tables`` profile lends only rows whose
# group stays inside one node (inter_node false): the scale-up fabric the two node types share, not their NICs
COLLECTIVE_KINDS = ("collective", "layout", "inter_node")
# the column of a row lent by a ``scaled_device_tables`` profile: the factor its times were scaled by
SCALED = "time_scale"
# the time columns of each device suite's rows, and the suites whose kernels run at the tensor cores' rate (scaled
# by the ratio of dense peaks at the row's dtype; the LM-head GEMM of the vocab suite too); the others move bytes
# (scaled by the ratio of HBM bandwidths). Allocator rows hold bytes: no time of theirs is read.
TIME_COLUMNS = {"gemm": ("t_s", "t_p10_s", "t_p90_s"), "grouped_gemm": ("fwd_s", "bwd_s", "fwd_p10_s", "fwd_p90_s"),
                "sdpa": ("fwd_s", "bwd_s"), "router": ("fwd_s", "bwd_s"), "elementwise": ("fwd_s", "bwd_s"),
                "vocab": ("fwd_s", "bwd_s"), "allocator": ()}
TENSOR_CORE_SUITES = ("gemm", "grouped_gemm", "sdpa")


def _read_suite(conn, table: str, profile: str, run_cols: str = "") -> pd.DataFrame:
    from sqlalchemy import text

    from scaleplan.db.identity import same_hardware

    q = text(f"SELECT p.*, r.started_at AS run_started, r.id AS run_order{run_cols} FROM {table} p "
             "JOIN bench_run r ON p.run_id = r.id WHERE r.profile = :prof AND p.status = 'OK'")
    # only runs of this profile's hardware (or forced with --as-profile): CPU timings stored under
    # a B200 profile must not replace its tables however new they are (scaleplan/db/identity.py)
    return same_hardware(pd.read_sql(q, conn, params={"prof": profile}), profile)


def _kinds(df: pd.DataFrame, cols: tuple[str, ...]) -> set[tuple]:
    """The kinds of rows a frame holds (tuples of ``cols``; one kind for a suite without such columns)."""
    if df.empty:
        return set()
    cols = tuple(c for c in cols if c in df.columns)
    return set(df[list(cols)].astype(str).itertuples(index=False, name=None)) if cols else {()}


def lend_rows(own: pd.DataFrame, lender: pd.DataFrame, cols: tuple[str, ...]) -> pd.DataFrame:
    """``own`` with the rows of ``lender`` whose kind (``cols``, :data:`DEVICE_SUITES`) ``own`` has none of."""
    if lender.empty:
        return own
    have = _kinds(own, cols)
    keep = [c for c in cols if c in lender.columns]
    kinds = lender[keep].astype(str).itertuples(index=False, name=None) if keep else [()] * len(lender)
    lent = lender[[k not in have for k in kinds]]
    return own if lent.empty else pd.concat([own, lent], ignore_index=True) if not own.empty else lent


def is_scaled(df: pd.DataFrame) -> bool:
    """Whether ``df`` holds rows of another part scaled to this one (:func:`scale_to_part`)."""
    return not df.empty and SCALED in df and bool(df[SCALED].notna().any())


def part_scales(profile: str, lender: str) -> tuple[dict[str, float], float]:
    """The factors a device time ``lender`` measured is multiplied by to be ``profile``'s, a part of the same
    tensor-core generation (scaled_device_tables): (per dtype, the lender's dense peak over this profile's,
    FLOP/s / FLOP/s; the lender's HBM bandwidth over this profile's, B/s / B/s).
    A lender's device time times these is this part's: the same tensor-core lanes per SM and clock at other clocks
    or SM counts, which the datasheet peaks carry (scaleplan.profiles.TENSOR_CORE_GENERATION). A dtype without a
    lane on either falls back to bf16's ratio."""
    from scaleplan.profiles import profile_file

    mine, theirs = profile_file(profile), profile_file(lender)
    lanes = set(mine.peak_flops) & set(theirs.peak_flops)
    peak = {dt: theirs.peak_flops[dt] / mine.peak_flops[dt] for dt in lanes}
    return peak, theirs.hbm_bandwidth / mine.hbm_bandwidth


def scale_to_part(df: pd.DataFrame, suite: str, scales: tuple[dict[str, float], float]) -> pd.DataFrame:
    """``df`` (rows of ``suite`` another part of the generation measured) with its times in this part's seconds
    (:func:`part_scales`' ``scales``), each row's factor in :data:`SCALED`."""
    if df.empty:
        return df
    peak, hbm = scales
    dt = df["dtype"].astype(str) if "dtype" in df else pd.Series("bf16", index=df.index)
    on_tensor_cores = dt.map(lambda d: peak.get(d, peak.get("bf16", hbm))).astype(float)
    if suite in TENSOR_CORE_SUITES:
        f = on_tensor_cores
    elif suite == "vocab":
        f = on_tensor_cores.where(df["op"] == "lm_head_gemm", hbm)
    else:
        f = pd.Series(hbm, index=df.index, dtype=float)
    out = df.assign(**{SCALED: f})
    for col in (c for c in TIME_COLUMNS[suite] if c in out):
        out[col] = out[col] * f
    if "flops_per_s" in out:
        out["flops_per_s"] = out["flops_per_s"] / f
    return out


def load_frames(url: str | None, profile: str) -> dict[str, pd.DataFrame]:
    """Read every measurement table of ``profile`` (OK rows), with the kinds of device rows it lacks lent
    by its ``device_tables`` profiles (:func:`lend_rows`), or in its ``device_tables_first`` suites the lenders'
    kinds in place of its own; each row says whose it is in
    :data:`FROM_PROFILE`. Also the dense GEMM rows of its ``fp8_ratio_tables`` profiles (:data:`SAME_DIE_GEMM`).
    Missing schema -> empty frames."""
    from sqlalchemy import inspect

    from scaleplan.db.session import get_engine, resolve_url

    eng = get_engine(resolve_url(url))
    names = set(inspect(eng).get_table_names())
    out: dict[str, pd.DataFrame] = {}
    from scaleplan.db.identity import run_columns_sql

    run_cols = run_columns_sql({c["name"] for c in inspect(eng).get_columns("bench_run")}) \
        if "bench_run" in names else ""
    lenders, first = named_profiles(profile, "device_tables"), named_profiles(profile, "device_tables_first")
    parts = [(other, part_scales(profile, other)) for other in named_profiles(profile, "scaled_device_tables")]
    with eng.connect() as conn:
        for suite, table in SUITE_TABLE.items():
            have = table in names and "bench_run" in names
            out[suite] = _read_suite(conn, table, profile, run_cols).assign(**{FROM_PROFILE: profile}) \
                if have else pd.DataFrame()
            for other in lenders if have and suite in DEVICE_SUITES else ():
                theirs = _read_suite(conn, table, other, run_cols).assign(**{FROM_PROFILE: other})
                out[suite] = lend_rows(theirs, out[suite], DEVICE_SUITES[suite]) if suite in first \
                    else lend_rows(out[suite], theirs, DEVICE_SUITES[suite])
            for other, scales in parts if have and suite in DEVICE_SUITES else ():  # after the measured lenders
                theirs = scale_to_part(_read_suite(conn, table, other, run_cols), suite, scales)
                out[suite] = lend_rows(out[suite], theirs.assign(**{FROM_PROFILE: other}), DEVICE_SUITES[suite])
            for other in named_profiles(profile, "fabric_tables") if have and suite == "collectives" else ():
                theirs = _read_suite(conn, table, other, run_cols)
                theirs = theirs[~theirs["inter_node"].astype(bool)] if not theirs.empty else theirs
                out[suite] = lend_rows(out[suite], theirs.assign(**{FROM_PROFILE: other}), COLLECTIVE_KINDS)
        # the dense GEMM rows of the profiles on the same die, for the FP8 / bf16 ratio (table_build._build_gemm)
        have = {SUITE_TABLE["gemm"], "bench_run"} <= names
        same_die = [_read_suite(conn, SUITE_TABLE["gemm"], other, run_cols).assign(**{FROM_PROFILE: other})
                    for other in named_profiles(profile, "fp8_ratio_tables") if have]
        out[SAME_DIE_GEMM] = pd.concat(same_die, ignore_index=True) if same_die else pd.DataFrame()
    return out


def named_profiles(profile: str, field: str) -> tuple[str, ...]:
    """What a built-in profile or profile YAML names in ``field`` (the profiles of ``device_tables``,
    ``fp8_ratio_tables``; the suites of ``device_tables_first``); none for a name no profile file has."""
    from scaleplan.errors import SpecError
    from scaleplan.profiles import profile_file

    try:
        return getattr(profile_file(profile), field)
    except SpecError:
        return ()


# what each suite's rows are costed as in the time and memory model (the estimator's component names)
SUITE_COMPONENTS = {"gemm": "attn_proj, dense_mlp, shared_expert, router GEMM", "grouped_gemm": "experts",
                    "sdpa": "sdpa", "router": "router top-k, permute", "elementwise": "elementwise",
                    "vocab": "vocab (LM head, cross-entropy)", "collectives": "tp/cp/ep/dp collectives",
                    "dispatch": "dispatch law (t_gap, t_host)", "allocator": "memory (allocator reserve)"}


def coverage(frames: dict[str, pd.DataFrame], law_source: str | None = None) -> list[dict]:
    """Per suite of :func:`load_frames`'s frames: the components it costs, ``source`` "measured" with where
    its rows come from (``from``: {profile: {kind: rows}}), else "analytic" (the model's roofline or default
    stands in), or for dispatch without rows the profile's trace-derived law (``law_source``: its source
    text) when it has one. One dict per suite, in :data:`SUITE_TABLE` order. The dense GEMM rows of the profiles
    on the same die (:data:`SAME_DIE_GEMM`) are listed under gemm as "<profile> (FP8 / bf16 ratio)" where the
    profile has bf16 rows and no FP8 rows of its own (estimator/table_build.py composes its FP8 table from them).
    A suite holding another part's rows scaled to this one (scaled_device_tables) is "composed", those rows listed
    as "<profile> (scaled to this part)"."""
    out = []
    for suite in SUITE_TABLE:
        df = frames.get(suite, pd.DataFrame())
        src = "composed" if is_scaled(df) else "measured" if not df.empty else (
            f"profile law ({law_source})" if suite == "dispatch" and law_source else "analytic")
        row = {"suite": suite, "components": SUITE_COMPONENTS[suite], "source": src, "from": {}}
        if not df.empty:
            cols = [c for c in DEVICE_SUITES.get(suite, ("collective", "layout")) if c in df.columns]
            for prof, g in df.groupby(FROM_PROFILE) if FROM_PROFILE in df.columns else [("?", df)]:
                kinds = g.groupby(cols).size() if cols else pd.Series({"all": len(g)})
                who = f"{prof} ({BORROWED_ROWS['scaled_device_tables']})" if is_scaled(g) else str(prof)
                row["from"][who] = {(" ".join(map(str, k)) if isinstance(k, tuple) else str(k)): int(n)
                                          for k, n in kinds.items()}
        die, dts = frames.get(SAME_DIE_GEMM, pd.DataFrame()), set(df["dtype"]) if "dtype" in df else set()
        if suite == "gemm" and not die.empty and "bf16" in dts and "fp8" not in dts:
            for prof, g in die.groupby(FROM_PROFILE):
                row["from"][f"{prof} ({BORROWED_ROWS['fp8_ratio_tables']})"] = {str(k): int(n) for k, n in g.groupby("dtype").size().items()}
        out.append(row)
    return out


def require_tables(url: str | None, profile: str, flag: str = "--db") -> str:
    """The resolved URL of a database that holds measured tables of ``profile``, for the scripts whose figures
    mean nothing without them (benchmarks/*.py ``--db``). Never creates the database.

    Raises ScaleplanError (one line naming ``flag`` and the masked URL): an SQLite file that does not exist, or a
    database without one OK row of any bench suite for the profile (a new or empty database: every component
    would be costed analytically, and the figures would be the analytic model's without saying so)."""
    from pathlib import Path

    from scaleplan.db.session import mask_url, resolve_url
    from scaleplan.errors import ScaleplanError

    u = resolve_url(url)
    hint = ("import them first, e.g. `scaleplan db import-scaleplan ../shared/recorded/dmlc-scaleplan "
            f"{flag} {url or u}`")
    if u.startswith("sqlite:///") and not Path(u.removeprefix("sqlite:///")).is_file():
        raise ScaleplanError(f"{flag} {mask_url(u)}: no such database file (nothing created); {hint}")
    if all(f.empty for k, f in load_frames(u, profile).items() if k in SUITE_TABLE):
        raise ScaleplanError(f"{flag} {mask_url(u)}: no measured tables of {profile} in this database; {hint}")
    return u
