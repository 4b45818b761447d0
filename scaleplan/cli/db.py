"""`scaleplan db`: upgrade | downgrade | status | stats | coverage | import-scaleplan | import-recorded."""
from __future__ import annotations

from pathlib import Path

import typer

from scaleplan.cli._common import DbOpt, JsonOpt, db_url, lazy_module, print_json, stdout, want_json

# loaded on first use: `scaleplan --help` must not pay for SQLAlchemy and the ORM. SQLAlchemy itself is
# imported where it is used, never through lazy_module: a lazy `sqlalchemy` parent breaks its own
# `from sqlalchemy.orm import ...` (sqlalchemy.sql.base missing half-way through), which the ORM and
# the migrations' env.py do (`db upgrade` failed so in a fresh process)
m = lazy_module("scaleplan.db.models")
dbs = lazy_module("scaleplan.db.session")

app = typer.Typer(no_args_is_help=True)


@app.command("upgrade")
def upgrade(revision: str = typer.Argument("head"), db: str = DbOpt, json_out: bool = JsonOpt) -> None:
    """Create or migrate the schema to REVISION (default head)."""
    url = dbs.resolve_url(db_url(db))
    rev = dbs.upgrade(url, revision)
    if want_json(json_out):
        print_json({"url": dbs.mask_url(url), "revision": rev})
    else:
        stdout.print(f"{dbs.mask_url(url)}: at revision {rev}")


@app.command("downgrade")
def downgrade(revision: str = typer.Argument(..., help="Target revision, e.g. base or -1."),
              db: str = DbOpt, json_out: bool = JsonOpt) -> None:
    """Migrate the schema down to REVISION."""
    url = dbs.resolve_url(db_url(db))
    rev = dbs.downgrade(url, revision)
    if want_json(json_out):
        print_json({"url": dbs.mask_url(url), "revision": rev})
    else:
        stdout.print(f"{dbs.mask_url(url)}: at revision {rev}")


@app.command("status")
def status(db: str = DbOpt, json_out: bool = JsonOpt) -> None:
    """Show the database URL (password masked), its revision and the head revision, and the cache folder."""
    from scaleplan.db.state_cache import cache_root

    url = dbs.resolve_url(db_url(db))
    cur, head = dbs.current_revision(url), dbs.head_revision()
    out = {"url": dbs.mask_url(url), "dialect": url.split(":", 1)[0], "revision": cur, "head": head,
           "up_to_date": cur == head, "cache": str(cache_root())}
    if want_json(json_out):
        print_json(out)
    else:
        stdout.print(f"database  {out['url']}\nrevision  {cur or 'none (run scaleplan db upgrade)'}\n"
                     f"head      {head}\nstatus    {'up to date' if cur == head else 'needs upgrade'}\n"
                     f"cache     {out['cache']} (derived files, safe to delete; set $SCALEPLAN_CACHE to move it)",
                     highlight=False)


def table_stats(url: str) -> dict:
    """Row counts per measurement table and per profile, plus runs, observations, calibrations."""
    import sqlalchemy as sa

    with dbs.session_scope(url) as s:
        tables = {}
        for suite, t in m.MEASUREMENT_TABLES.items():
            rows = s.execute(sa.select(m.BenchRun.profile, t.status, sa.func.count())
                             .join(m.BenchRun, m.BenchRun.id == t.run_id)
                             .group_by(m.BenchRun.profile, t.status)).all()
            per: dict[str, dict[str, int]] = {}
            for prof, st, n in rows:
                per.setdefault(prof, {})[st] = n
            tables[suite] = {"rows": sum(n for *_, n in rows), "by_profile": per}
        return {"tables": tables,
                "bench_runs": s.scalar(sa.select(sa.func.count()).select_from(m.BenchRun)),
                "observed_runs": s.scalar(sa.select(sa.func.count()).select_from(m.ObservedRun)),
                "calibrations": s.scalar(sa.select(sa.func.count()).select_from(m.Calibration)),
                "law_runs": s.scalar(sa.select(sa.func.count()).select_from(m.LawRun)),
                "law_fits": s.scalar(sa.select(sa.func.count()).select_from(m.LawFit))}


@app.command("stats")
def stats(db: str = DbOpt, json_out: bool = JsonOpt) -> None:
    """Row counts per measurement table, status and hardware profile."""
    url = dbs.resolve_url(db_url(db))
    dbs.ensure_schema(url)
    st = table_stats(url)
    if want_json(json_out):
        print_json({"url": dbs.mask_url(url), **st})
        return
    from rich.table import Table

    t = Table("table", "profile", "rows by status", title=f"{dbs.mask_url(url)}")
    for suite, info in st["tables"].items():
        if not info["by_profile"]:
            t.add_row(suite, "-", "0")
        for prof, by in sorted(info["by_profile"].items()):
            t.add_row(suite, prof, ", ".join(f"{k} {v}" for k, v in sorted(by.items())))
    stdout.print(t)
    stdout.print(f"bench runs {st['bench_runs']}, observed runs {st['observed_runs']}, calibrations "
                 f"{st['calibrations']}, law runs {st['law_runs']}, law fits {st['law_fits']}")


@app.command("coverage")
def coverage(profile: str = typer.Option(..., "--profile", help="A node type (cluster profile) or profile YAML."),
             db: str = DbOpt, json_out: bool = JsonOpt) -> None:
    """Which components of PROFILE's time model are measured, and whose rows measure them."""
    from scaleplan.db.measurements import coverage as cover
    from scaleplan.db.measurements import load_frames
    from scaleplan.profiles import profile_file

    prof = profile_file(profile)  # an unknown profile: one line, exit 2
    url = dbs.resolve_url(db_url(db))
    dbs.ensure_schema(url)
    rows = cover(load_frames(url, profile), prof.dispatch.source if prof.dispatch else None)
    if want_json(json_out):
        print_json({"profile": profile, "suites": rows})
        return
    from rich.table import Table

    t = Table("suite", "costs", "source", "rows (profile: kind rows)", title=f"{profile}: measured or analytic")
    for r in rows:
        whose = "; ".join(f"{p}: " + ", ".join(f"{k} {n}" for k, n in kinds.items()) for p, kinds in r["from"].items())
        t.add_row(r["suite"], r["components"], r["source"], whose or "-")
    stdout.print(t)


@app.command("import-scaleplan")
def import_scaleplan(directory: Path = typer.Argument(..., help="A directory of recorded tables "
                                                      "(e.g. ../shared/recorded/dmlc-scaleplan)."),
                     db: str = DbOpt, json_out: bool = JsonOpt) -> None:
    """Import the reference estimator's published table format (idempotent)."""
    from scaleplan.db.importers import import_scaleplan_dir

    url = dbs.resolve_url(db_url(db))
    dbs.ensure_schema(url)
    with dbs.session_scope(url) as s:
        res = import_scaleplan_dir(s, directory)
    _report_import(url, res, json_out)


@app.command("import-recorded")
def import_recorded(directory: Path = typer.Argument(None, help="Default: the package's cluster_profiles/recorded."),
                    db: str = DbOpt, json_out: bool = JsonOpt) -> None:
    """Import scaleplan's own recorded tables (CSV written by `scaleplan bench export`)."""
    from scaleplan.db.recorded import default_recorded_dir, import_recorded_dir

    url = dbs.resolve_url(db_url(db))
    dbs.ensure_schema(url)
    with dbs.session_scope(url) as s:
        res = import_recorded_dir(s, directory or default_recorded_dir())
    _report_import(url, res, json_out)


def _report_import(url: str, res, json_out: bool) -> None:
    """The import's table (or JSON), once a new connection sees every bench run it names (db.session.read_back)."""
    from scaleplan.db.models import BenchRun

    dbs.read_back(url, BenchRun, [i for r in res for i in r.run_ids])
    if want_json(json_out):
        print_json([r.__dict__ for r in res])
        return
    from rich.table import Table

    t = Table("file", "suite", "rows in file", "points", "new")
    for r in res:
        t.add_row(r.file, r.suite, str(r.rows_in_file), str(r.points), str(r.inserted))
    stdout.print(t)
