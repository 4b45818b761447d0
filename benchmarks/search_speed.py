"""Speed of `scaleplan search` on the paper's full grid (not a test; prints figures).

The paper's envelope: q in {8..18}, its 13 expert counts, K in {1,2,4,6,8}, G in {1,2,4,8}, S >= 0.7, every
layout on 256 devices (32 p6-b200 nodes) with mbs in {1,2,4} and 4 checkpointing modes, 20 days.
Imports ../shared/recorded/dmlc-scaleplan into a temporary SQLite database first (not timed).
Prints wall and CPU seconds per worker count, ms per geometry, the optimum, and the load average
(other processes on the machine inflate the wall time); then the uncertainty pass of ``--samples N``
(the paper law's ridge sampler, then the N draws over every candidate) timed on its own, since the plan
search runs once per candidate whatever N is. Then the plan search one geometry per evaluation against the
batched evaluation (``Estimator.best_plans``; :func:`compare_paths`), CPU seconds of each in this one process
and their ratio, per stage. Last, where the CPU goes (``--stages``, default on): the
whole search (``mosaic.run.run_search``, the command minus its argument parsing and printing) on one worker
under cProfile with a CPU-time clock, its CPU split by stage (table load, enumeration, kernels, collectives,
composition, pipeline, memory, uncertainty draws; ``STAGES``) with call counts, scaled to the unprofiled CPU
of the same run (profiling inflates the many small calls, so the shares are what to read).

    python benchmarks/search_speed.py [--recorded DIR] [--db URL] [--workers 1,2] [--samples 200] [--no-stages]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--recorded", default=str(REPO.parent / "shared" / "recorded" / "dmlc-scaleplan"))
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--samples", type=int, default=200)
    ap.add_argument("--db", default=None, help="a database with the recorded tables (default: import them)")
    ap.add_argument("--no-stages", dest="stages", action="store_false", help="skip the per-stage CPU profile")
    a = ap.parse_args()
    if a.db:
        from _db import tables_db  # benchmarks/_db.py: a database without tables is refused in one line

        _speed(a, tables_db(a.db))
        return
    from scaleplan.db import session as dbs
    from scaleplan.db.importers import import_scaleplan_dir

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/speed.db"
        dbs.upgrade(url)
        with dbs.session_scope(url) as s:
            import_scaleplan_dir(s, Path(a.recorded))
        _speed(a, url)


def _speed(a, url: str) -> None:
    """The timings of the module docstring on the database ``url``."""
    from scaleplan.estimator import Estimator

    from scaleplan.mosaic.ladder import LadderGrid
    from scaleplan.mosaic.search import Envelope, Mosaic

    t0 = time.perf_counter()
    est = Estimator("p6-b200.48xlarge", db_url=url)
    print(f"estimator construction (tables load): {time.perf_counter() - t0:.2f} s")
    for w in (int(x) for x in a.workers.split(",")):
        m = Mosaic(est, LadderGrid(), workers=w)
        c0, t0 = os.times(), time.perf_counter()
        res = m.run(Envelope(nodes=a.nodes, days=20))
        wall, c1 = time.perf_counter() - t0, os.times()
        cpu = (c1.user + c1.system + c1.children_user + c1.children_system
               - c0.user - c0.system - c0.children_user - c0.children_system)
        b = res.best
        n = len(m.geoms)
        print(f"workers={w}: {n} geometries ({m.grid.n_combinations} grid points) on {res.n_devices} devices: "
              f"wall {wall:.2f} s, CPU {cpu:.2f} s ({1e3 * cpu / n:.1f} ms CPU/geometry), "
              f"{int(res.table.feasible.sum())} feasible; load average {os.getloadavg()[0]:.1f}")
        print(f"  optimum: L={b.n_layers} E={b.n_experts} K={b.topk} G={b.g} N_act={b.n_act / 1e9:.1f}B "
              f"S={b.s:.3f} TPP={b.tpp:.0f} MFU={100 * b.mfu_plan:.2f}% loss={b.loss:.4f}")
    if a.samples:
        _uncertainty(res, a.nodes, a.samples)
    compare_paths(url, a.nodes, a.stages)
    if a.stages:
        stage_profile(url, a.nodes, a.samples)


def compare_paths(url: str, nodes: int, stages: bool = True) -> None:
    """The plan search of the paper grid (``Estimator.best_plans`` over every geometry) one geometry per
    evaluation (chunk 1, the path before batching) and in batches (search.CHUNK), in this one process:
    CPU seconds (process_time) of each, fresh tables and plan caches for each, and with ``stages`` their
    split by stage under cProfile (same stages as :func:`stage_profile`) with the ratio per stage."""
    import cProfile
    import pstats

    from scaleplan.estimator import Estimator, plans, table_build
    from scaleplan.mosaic.ladder import LadderGrid, enumerate_geometries, geometry_model
    from scaleplan.mosaic.search import CHUNK

    grid = LadderGrid()
    models = [geometry_model(r, grid) for r in enumerate_geometries(grid).itertuples(index=False)]
    n_dev = nodes * 8
    cpu, split = {}, {}
    for name, chunk in (("per geometry", 1), ("batched", CHUNK)):
        for profiled in (False, True) if stages else (False,):
            table_build.cached_tables.cache_clear()  # fresh tables: no lookup memoised by the other run
            plans._PLAN_CACHE.clear()
            est = Estimator("p6-b200.48xlarge", db_url=url)
            run = lambda e=est, c=chunk: e.best_plans(models, n_dev, 1024, 2048, "adamw", chunk=c)  # noqa: E731
            if not profiled:
                c0 = time.process_time()
                run()
                cpu[name] = time.process_time() - c0
                continue
            prof = cProfile.Profile(time.process_time)
            prof.runcall(run)
            st = pstats.Stats(prof)
            rows = {s: _inclusive(st, funcs)[0] for s, funcs in STAGES[1:9] if s != "uncertainty draws"}
            total = sum(v[3] for k, v in st.stats.items() if k[2] == "best_plans")
            split[name] = {k: v * cpu[name] / total for k, v in rows.items()}
    ratio = cpu["per geometry"] / cpu["batched"]
    print(f"plan search, {len(models)} geometries on {n_dev} devices, one process: per geometry "
          f"{cpu['per geometry']:.2f} s CPU, batched {cpu['batched']:.2f} s CPU: {ratio:.1f}x")
    if split:
        print(f"  {'stage (inclusive)':<20} {'per geom':>9} {'batched':>9} {'ratio':>6}")
        for s in split["batched"]:
            a, b = split["per geometry"][s], split["batched"][s]
            print(f"  {s:<20} {a:9.2f} {b:9.2f} {a / b if b else float('nan'):6.1f}")


def _uncertainty(res, nodes: int, n: int) -> None:
    """Time --samples n on a finished search: ridge sampling (first call) and the vectorised draws."""
    from scaleplan.mosaic.law import PAPER_JOINT_LAW
    from scaleplan.mosaic.report import attach_uncertainty
    from scaleplan.mosaic.ridge import ridge_samples
    from scaleplan.mosaic.search import Envelope
    from scaleplan.mosaic.uncertainty import FALLBACK_SIGMA, MfuError

    c0, t0 = os.times(), time.perf_counter()
    ridge_samples(n)
    t_ridge = time.perf_counter() - t0
    unc = attach_uncertainty([(Envelope(nodes=nodes, days=20), res)], PAPER_JOINT_LAW, None, "paper",
                             MfuError(FALLBACK_SIGMA, "fallback"), n)[0]
    wall, c1 = time.perf_counter() - t0, os.times()
    print(f"--samples {n}: ridge sampler {t_ridge:.2f} s, draws over {int(res.table.plan_ok.sum())} candidates "
          f"{wall - t_ridge:.2f} s; total {wall:.2f} s wall, {c1.user + c1.system - c0.user - c0.system:.2f} s CPU; "
          f"{'; '.join(unc['verdicts']['statements'][:2])}")


# stage -> the functions (path suffix, name) whose inclusive CPU it is; a stage that holds another's
# functions (DP collectives inside "collectives", say) has that share subtracted, so the rows add up
STAGES = [
    ("table load", [("estimator/api.py", "__init__")]),
    ("enumeration", [("estimator/plans.py", "enumerate_plans"), ("mosaic/ladder.py", "enumerate_geometries")]),
    ("collectives", [("estimator/comm.py", "collective_time")]),
    ("kernels", [("estimator/kernels.py", "layer_kernels")]),
    ("pipeline", [("estimator/model.py", "_pipeline_terms"), ("estimator/model.py", "_pp_p2p"),
                  ("estimator/model.py", "_stages")]),
    ("DP and optimizer", [("estimator/model.py", "_dp_and_optimizer")]),
    ("composition", [("estimator/model.py", "pipelined"), ("estimator/model.py", "finish")]),
    ("memory", [("estimator/api.py", "_memory"), ("estimator/api.py", "_state_fits")]),
    ("plan pruning", [("estimator/best_plans.py", "_candidates")]),
    ("uncertainty draws", [("mosaic/run.py", "_uncertainty")]),
    ("whole search", [("mosaic/run.py", "run_search")]),
]


def _inclusive(stats, funcs) -> tuple[float, int]:
    """(inclusive CPU seconds, calls) of the profiled functions matching ``funcs``; a function calling
    another in the list is counted once (its callee's time is inside its own)."""
    keys = [k for k in stats.stats if any(k[0].endswith(f) and k[2] == n for f, n in funcs)]
    inner = {k for k in keys if any(c in keys and c != k for c in _callers_closure(stats, k))}
    return (sum(stats.stats[k][3] for k in keys if k not in inner),
            sum(stats.stats[k][1] for k in keys if k not in inner))


def _callers_closure(stats, key, depth: int = 12) -> set:
    """Every function above ``key`` in the profiled call graph (``depth`` levels)."""
    seen, frontier = set(), {key}
    for _ in range(depth):
        frontier = {c for k in frontier for c in stats.stats.get(k, (0, 0, 0, 0, {}))[4]} - seen
        if not frontier:
            break
        seen |= frontier
    return seen


def stage_profile(url: str, nodes: int, samples: int) -> None:
    """The whole search on one worker under cProfile (CPU clock): CPU seconds and calls per stage."""
    import cProfile
    import pstats

    from scaleplan.estimator import table_build
    from scaleplan.mosaic.run import SearchRequest, run_search

    req = SearchRequest("p6-b200.48xlarge", (nodes,), (20.0,), samples=samples, workers=1, progress=False,
                        db_url=url)
    table_build.cached_tables.cache_clear()  # the table load as a command sees it (disk cache, if any)
    c0 = time.process_time()
    run_search(req)
    plain = time.process_time() - c0
    table_build.cached_tables.cache_clear()
    prof = cProfile.Profile(time.process_time)
    prof.runcall(run_search, req)
    st = pstats.Stats(prof)
    rows = {name: _inclusive(st, funcs) for name, funcs in STAGES}
    total = rows["whole search"][0]
    scale = plain / total if total else 1.0
    # nested stages: collectives are read inside kernels and DP, kernels and the rest inside evaluate
    coll = rows["collectives"][0]
    excl = dict((k, v[0]) for k, v in rows.items())
    dp_coll = _inclusive_under(st, STAGES[2][1], ("estimator/model.py", "_dp_and_optimizer"))
    excl["kernels"] -= coll - dp_coll
    excl["DP and optimizer"] -= dp_coll
    excl["composition"] -= sum(rows[k][0] for k in ("kernels", "pipeline", "DP and optimizer"))
    print(f"command start-up in a fresh process (imports, the Estimator with its tables from the disk cache): "
          f"{_startup_cpu(url):.2f} s CPU")
    print(f"where the CPU goes (1 worker, --samples {samples}; {plain:.2f} s CPU unprofiled, "
          f"{total:.2f} s profiled):")
    print(f"  {'stage':<20} {'CPU s':>7} {'share':>6} {'calls':>8}")
    for name, _ in STAGES[:-1]:
        sec, calls = excl[name], rows[name][1]
        print(f"  {name:<20} {sec * scale:7.2f} {sec / total:6.1%} {calls:8d}")
    rest = total - sum(excl[n] for n, _ in STAGES[:-1])
    print(f"  {'other':<20} {rest * scale:7.2f} {rest / total:6.1%}")


def _startup_cpu(url: str) -> float:
    """CPU seconds of a fresh interpreter importing the search command's modules and building its
    Estimator (the tables come from the disk cache the runs above filled), least of three."""
    import subprocess
    import sys

    code = ("import time\nfrom scaleplan.cli import main\nfrom scaleplan.mosaic.run import run_search\n"
            "from scaleplan.estimator import Estimator\n"
            f"Estimator('p6-b200.48xlarge', db_url={url!r})\nprint(time.process_time())")
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True) for _ in range(3)]
    return min(float(r.stdout.split()[-1]) for r in runs)


def _inclusive_under(stats, funcs, parent) -> float:
    """Inclusive CPU of ``funcs`` spent in calls made (at any depth) under ``parent`` (path, name),
    apportioned by the calls each direct caller made."""
    total = 0.0
    for k in stats.stats:
        if not any(k[0].endswith(f) and k[2] == n for f, n in funcs):
            continue
        callers = {c: v for c, v in stats.stats[k][4].items() if c != k}  # not its own recursion
        n_all = sum(v[0] for v in callers.values()) or 1
        for c, v in callers.items():
            if any(c2[0].endswith(parent[0]) and c2[2] == parent[1] for c2 in _callers_closure(stats, c) | {c}):
                total += stats.stats[k][3] * v[0] / n_all
    return total


if __name__ == "__main__":
    main()
