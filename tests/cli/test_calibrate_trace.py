"""`scaleplan calibrate trace` on the command line: the plan read from a Megatron-LM log, the stage from the
trace's rank, the fitted law stored; bad input refused in one line (library: tests/calibrate/test_trace.py)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from tests.calibrate.trace_gen import collective_group, host_bound_rank

PROFILE = "p6-b200.48xlarge"
LOG = Path(__file__).resolve().parents[1] / "data" / "megatron" / "5p4b_tp4_pp2_ep8.log"


def _small_log(tmp_path) -> Path:
    """The fixture log with 4 layers and a global batch of 16 (n_mb 2 on dp 8): a trace of it stays small."""
    text = LOG.read_text()
    text = re.sub(r"^(  num_layers \.+ )32$", r"\g<1>4", text, flags=re.MULTILINE)
    text = re.sub(r"^(  global_batch_size \.+ )1024$", r"\g<1>16", text, flags=re.MULTILINE)
    p = tmp_path / "small.log"
    p.write_text(text)
    return p


def test_cli_reads_the_plan_from_the_megatron_log_and_stores_the_fitted_law(run, tmp_path, sqlite_url):
    from scaleplan.estimator import Estimator

    law = Estimator(PROFILE, db_url=sqlite_url).dispatch
    units = 3.1 / 4  # selective recompute's kernel units (estimator/ckpt.py)
    fixed_us = (2 * law.t_ep_host_s * units + law.t_host_s) * 1e6  # stage 1 of 4 layers on pp 2: 2 MoE layers
    r = host_bound_rank(kappa=400, gap_us=25.0, n_mb=2, layers=2, fixed_us=fixed_us)
    r.meta["distributedInfo"].update(rank=40, world_size=64)
    t = r.write(tmp_path / "rank40.json")
    code, out, err = run("calibrate", "trace", t, "--megatron-log", _small_log(tmp_path), "--db", sqlite_url, "--json")
    assert code == 0, err
    row = json.loads(out)["traces"][0]
    assert (row["stage"], row["n_mb"], row["L_stage"], row["E_loc"]) == (1, 2, 2, 16)
    assert row["kappa_measured"] == pytest.approx(400 / units)
    code, out, err = run("calibrate", "trace", t, "--megatron-log", _small_log(tmp_path), "--db", sqlite_url,
                         "--store")
    assert code == 0, err
    assert "stored dispatch calibration" in out and "kappa1 = 7.29 kept" in out
    # one E_loc: kappa0 from the count with kappa1 kept, and the simulated gap back
    assert Estimator(PROFILE, db_url=sqlite_url).dispatch.t_gap_s == pytest.approx(25e-6, rel=1e-3)


def test_cli_refuses_bad_input_in_one_line(run, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    code, _, err = run("calibrate", "trace", bad, "--megatron-log", LOG)
    assert code == 2 and "TRACE" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    code, _, err = run("calibrate", "trace", bad, bad, bad, "--megatron-log", LOG, "--megatron-log", LOG)
    assert code == 2 and "--megatron-log" in err
    code, _, err = run("calibrate", "trace", bad, "--megatron-log", LOG, "--profile", "nope")
    assert code == 2 and "--profile" in err


def test_cli_compares_the_collectives_of_ranks_on_one_stage(run, tmp_path, sqlite_url):
    """Ranks 0-3 and 32 of the fixture run (tp 4, dp 8: ranks 0-31 are stage 0, 32-63 stage 1): the four of
    stage 0 are compared, rank 32 alone on its stage is not."""
    delays = np.random.default_rng(3).exponential(40.0, size=(5, 4))
    paths = []
    for i, r in enumerate(collective_group(delays.tolist(), transfer_us=100.0, compute_us=200.0)):
        r.meta["distributedInfo"].update(rank=[0, 1, 2, 3, 32][i], world_size=64)
        paths.append(r.write(tmp_path / f"r{i}.json"))
    code, out, err = run("calibrate", "trace", *paths, "--megatron-log", LOG, "--db", sqlite_url, "--json")
    assert code == 0, err
    (w,) = json.loads(out)["peer_waits"]
    assert w["stage"] == 0 and w["ranks"] == [0, 1, 2, 3]
    d = delays[:4]  # rank 32's delays shaped the collectives' timing, but its kernels are not compared
    assert w["wait_s"] == pytest.approx(float(((d.max(axis=0) - d).mean(axis=0)).sum()) * 1e-6)
