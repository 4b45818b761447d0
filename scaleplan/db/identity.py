"""Hardware identity of a benchmark run: does the device it ran on match its profile's GPU?

A run stored under a profile is read into that profile's tables (estimator.tables). A run measured
on other hardware (CPU timings under a B200 profile) would silently replace the profile's real
tables, so ``bench run`` refuses it (:func:`check_device_matches`) unless ``--as-profile`` forces
it (stored as ``bench_run.as_profile``), and the tables keep only runs whose identity holds
(:func:`same_hardware`). Imported runs carry the profile their source rows name (importers map each
row's device), so they are kept.
"""
from __future__ import annotations

from scaleplan.errors import SpecError
from scaleplan.profiles import gpu_model


def device_name(device_type: str | None, gpu_name: str | None) -> str | None:
    """What a run ran on, as one name: its GPU name, or "cpu"."""
    return "cpu" if device_type == "cpu" else gpu_name


def matches(profile_gpu: str | None, device_type: str | None, gpu_name: str | None) -> bool:
    """True when a run on (device_type, gpu_name) measures the GPU a profile names (its model token).
    A run that recorded no device at all cannot be judged and is kept."""
    ran_on = gpu_model(device_name(device_type, gpu_name))
    return ran_on is None or ran_on == gpu_model(profile_gpu)


def check_device_matches(profile: str, device_type: str, gpu_name: str | None, as_profile: bool) -> None:
    """Refuse to store a run measured on other hardware than ``profile``'s GPU (unless ``as_profile``).

    Raises SpecError (one line) naming the profile's GPU and the device the run is on.
    """
    from scaleplan.profiles import profile_file

    want = profile_file(profile).gpu_name
    if as_profile or matches(want, device_type, gpu_name):
        return
    have = device_name(device_type, gpu_name) or device_type
    raise SpecError("--profile", profile, f"a profile of the device this runs on: {profile} is {want}, this "
                    f"device is {have} (pass --as-profile to store these timings under {profile} anyway)")


def same_hardware(df, profile: str):
    """Rows of a table frame whose run is imported, forced (as_profile) or measured on ``profile``'s GPU.

    ``df`` carries ``run_source``, ``run_device``, ``run_gpu`` and optionally ``run_forced`` (databases
    before migration 0003 have no such column); those columns are dropped from the result.
    """
    extra = [c for c in ("run_source", "run_device", "run_gpu", "run_forced") if c in df.columns]
    if df.empty or "run_source" not in df.columns:
        return df.drop(columns=extra)
    from scaleplan.profiles import profile_file

    try:
        want = profile_file(profile).gpu_name
    except SpecError:  # a profile we cannot read: nothing to compare against
        return df.drop(columns=extra)
    keep = {r.run_order for r in df[["run_order", *extra]].drop_duplicates().itertuples(index=False)
            if r.run_source != "measured" or bool(getattr(r, "run_forced", False) or False)
            or matches(want, r.run_device, r.run_gpu)}
    return df[df["run_order"].isin(keep)].drop(columns=extra)


def run_columns_sql(bench_run_columns: set[str]) -> str:
    """The SELECT list fragment that :func:`same_hardware` needs, for the columns the schema has."""
    sql = ", r.source AS run_source, r.device AS run_device, r.gpu_name AS run_gpu"
    return sql + (", r.as_profile AS run_forced" if "as_profile" in bench_run_columns else "")
