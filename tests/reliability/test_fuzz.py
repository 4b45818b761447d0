"""Hostile input, property-based (hypothesis): the spec loader, layout strings, CLI options, --db URLs,
the recorded-table importer on corrupted files, and the CSV importers of ``calibrate add`` and
``law fit``.

Every property: no uncaught exception; a rejection is a ScaleplanError whose message is one line,
and through the CLI exit status 2 with one stderr line; a rejected import writes nothing (row
counts unchanged). Example counts are bounded so the module runs in well under a minute.
"""
from __future__ import annotations

import copy
import os
import re
import tempfile
from pathlib import Path

import pandas as pd
import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from pace import budget
from scaleplan.db import models as m
from scaleplan.db import session as dbs
from scaleplan.db.importers import import_scaleplan_dir
from scaleplan.errors import ScaleplanError, SpecError
from scaleplan.specs import Layout, Spec, load_spec, parse_layout, parse_spec

FUZZ = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FEW = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

BASE = {
    "model": {"n_layers": 4, "hidden_sz": 1024, "inter_sz": 4096, "n_q_heads": 8, "n_kv_heads": 8,
              "head_dim": 128, "vocab_sz": 32000, "precision": "bf16",
              "moe": {"n_experts": 8, "experts_per_token": 2, "expert_inter_sz": 512}},
    "search": {"num_devices": 8}, "performance": {"activation_checkpointing_type": "full"},
    "optimizer": {"optimizer_type": "adamw"}, "data": {"gbs": 64, "seqlen": 2048, "microbatch_sz": 1},
    "hardware": {"node_type": "p5.48xlarge"},
}


def _paths(d: dict, prefix: tuple = ()) -> list[tuple]:
    out = []
    for k, v in d.items():
        out.append((*prefix, k))
        if isinstance(v, dict):
            out += _paths(v, (*prefix, k))
    return out


PATHS = _paths(BASE)
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.integers(-3, 3),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=30),
    st.sampled_from(["bf16", "fp8", "full", "adamw", "p5.48xlarge", "1e3", "-1", "", "[/x]", "\x00"]),
)
VALUES = st.recursive(SCALARS, lambda c: st.one_of(st.lists(c, max_size=3),
                                                   st.dictionaries(st.text(max_size=8), c, max_size=3)),
                      max_leaves=6)


def _one_line_error(e: Exception) -> None:
    msg = str(e)
    assert isinstance(e, ScaleplanError), repr(e)
    assert msg and "\n" not in msg and "\r" not in msg, repr(msg)


@FUZZ
@given(edits=st.lists(st.tuples(st.sampled_from(PATHS), VALUES, st.booleans()), min_size=1, max_size=4))
def test_parse_spec_mutated(record, edits):
    """A valid spec with random fields replaced (or deleted): a Spec or a one-line SpecError."""
    record("fuzz_examples")
    d = copy.deepcopy(BASE)
    for path, value, delete in edits:
        node = d
        for k in path[:-1]:
            node = node.get(k) if isinstance(node, dict) else None
        if isinstance(node, dict):
            if delete:
                node.pop(path[-1], None)
            else:
                node[path[-1]] = value
    try:
        assert isinstance(parse_spec(d), Spec)
    except SpecError as e:
        _one_line_error(e)


@FUZZ
@given(data=VALUES)
def test_parse_spec_random_value(record, data):
    record("fuzz_examples")
    try:
        parse_spec(data)
    except SpecError as e:
        _one_line_error(e)


YAMLISH = st.one_of(
    st.text(max_size=200),
    st.text(alphabet=st.sampled_from(list("model:{}[]-,&*!|>'\"#\n 0123456789abxy_.%@`")), max_size=200),
    st.builds(lambda v: yaml.safe_dump(v), VALUES),
    st.sampled_from(["!!python/object/apply:os.system ['echo pwned']\n", "[" * 5000, "a: &x [*x]\n",
                     "model: !!binary AAAA\n", "---\n---\n", "model:\n\t- 1\n"]),
)


@FUZZ
@given(text=YAMLISH, binary=st.one_of(st.none(), st.binary(max_size=64)))
def test_load_spec_random_text(record, text, binary):
    record("fuzz_examples")
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "spec.yaml"
        if binary is not None:
            p.write_bytes(binary + text.encode("utf-8", "surrogatepass"))
        else:
            p.write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            load_spec(p)
        except SpecError as e:
            _one_line_error(e)


@FUZZ
@given(text=st.one_of(st.text(max_size=60),
                      st.lists(st.tuples(st.sampled_from(["tp", "cp", "pp", "dp", "ep", "etp", "vpp", "mbs",
                                                          "ckpt", "TP", "x", ""]),
                                         st.one_of(st.integers(-5, 2**64).map(str), st.text(max_size=6),
                                                   st.sampled_from(["full", "none", "1.5", "0x10", " 2 "]))),
                               max_size=6).map(lambda kv: ",".join(f"{k}={v}" for k, v in kv))))
def test_parse_layout_random(record, text):
    record("fuzz_examples")
    try:
        lay = parse_layout(text)
    except SpecError as e:
        _one_line_error(e)
        return
    assert isinstance(lay, Layout) and min(lay.tp, lay.cp, lay.pp, lay.ep, lay.etp, lay.vpp, lay.mbs) >= 1


# --- the CLI ------------------------------------------------------------------------------------

@pytest.fixture(scope="module", autouse=True)
def _scratch_cwd(tmp_path_factory):
    """Run this module in an empty folder: a fuzzed path or URL must never land in the repository."""
    here = os.getcwd()
    scratch = tmp_path_factory.mktemp("cwd")
    os.chdir(scratch)
    yield scratch
    os.chdir(here)


@pytest.fixture(scope="module")
def spec_file(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("spec") / "good.yaml"
    p.write_text(yaml.safe_dump(BASE))
    return p


@pytest.fixture(scope="module")
def small_db(tmp_path_factory, recorded_dir) -> str:
    """A migrated SQLite file with a few small recorded tables (router, dispatch)."""
    d = tmp_path_factory.mktemp("smalldb")
    url = f"sqlite:///{d / 'small.db'}"
    dbs.upgrade(url)
    return url


def _cli_ok_or_one_line(cli, *argv) -> tuple[int, str, str]:
    code, out, err = cli(*argv)
    assert "Traceback" not in out + err, (argv, err)
    assert code in (0, 1, 2), (argv, code, err)  # 1: a command's own "failed" status (e.g. validate)
    if code == 2 and "--json" in argv:  # under --json the error is a JSON object on stdout
        import json

        assert {"field", "value", "allowed"} <= set(json.loads(out)["error"]), (argv, out)
    elif code == 2:
        lines = [ln for ln in err.strip().splitlines() if ln.strip()]
        assert len(lines) == 1, (argv, err)
    return code, out, err


# any --devices: beyond the profile's max_nodes * gpus_per_node it is refused before any work
# (`layouts --devices 1e12` used to enumerate for minutes)
OPT_VALUES = st.one_of(st.text(max_size=12), st.integers(-10, 10**6).map(str), st.integers(10**6, 10**30).map(str),
                       st.sampled_from(["nan", "inf", "-1", "0", "1e3", "8", "", "--json", "[/b]"]))


@FEW
@given(devices=OPT_VALUES, layout=st.one_of(st.none(), st.text(max_size=30)),
       profile=st.one_of(st.none(), st.text(max_size=12), st.just("p5.48xlarge")))
def test_cli_estimate_options(record, cli, spec_file, small_db, devices, layout, profile):
    """``estimate``/``layouts`` with random --devices/--layout/--profile: exit 0/2, never a traceback."""
    record("fuzz_examples")
    argv = ["estimate", str(spec_file), "--devices", devices, "--db", small_db]
    if layout is not None:
        argv += ["--layout", layout]
    if profile is not None:
        argv += ["--profile", profile]
    _cli_ok_or_one_line(cli, *argv)
    _cli_ok_or_one_line(cli, "layouts", str(spec_file), "--devices", devices, "--db", small_db)


URL_PARTS = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=15)


@FEW
@given(scheme=st.sampled_from(["postgresql+psycopg", "postgresql", "mysql", "foo+bar", "", "sqlite+x", "http"]),
       user=URL_PARTS, pw=URL_PARTS, port=st.one_of(st.integers(-5, 70000).map(str), URL_PARTS), db=URL_PARTS)
@example(scheme="postgresql+psycopg", user="", pw="--db", port="", db="")  # a password that is the field's name
def test_cli_db_urls(record, cli, _scratch_cwd, scheme, user, pw, port, db):
    """Random --db URLs (host pinned to loopback, no DNS): status exits 0 or 2, one line, password masked."""
    record("fuzz_examples")
    url = f"{scheme}://{user}:{pw}@127.0.0.1:{port}/{db}"
    code, out, err = _cli_ok_or_one_line(cli, "db", "status", "--db", url)
    assert code == 2, (url, out)  # nothing listens on a random port with a random dialect... or refuses
    assert os.listdir(_scratch_cwd) == [], os.listdir(_scratch_cwd)  # a refused URL creates no file or folder
    # the password is what the URL parses to (a '/' in the user part ends the authority: the rest is the
    # database path, printed as such); it must not be printed unless it is also another part of the URL
    try:
        from sqlalchemy.engine import make_url

        secret, shown = make_url(url).password, dbs.mask_url(url)
    except Exception:  # unparseable: the CLI prints no part of it
        secret, shown = pw, "<unparseable database URL>"
    if secret is not None and len(secret) >= 4 and secret not in shown:
        # a SpecError line is "field: got VALUE; allowed": the field and the allowed text are fixed words (a
        # password spelled "--db" is in them by chance), so the given value is where a leak would show
        m = re.match(r"error: (.*?): got (.*); ", err.strip())
        assert secret not in (m.group(2) if m and m.group(1) == "--db" else err), (url, err)


# --- importers ----------------------------------------------------------------------------------

SMALL_FILES = ("dispatch_gap_b200.parquet", "vocab_gemm_ce_b200.csv", "topk_a100.csv")


def _counts(url: str) -> dict[str, int]:
    with dbs.session_scope(url) as s:
        return {t.__tablename__: s.scalar(select(func.count()).select_from(t))
                for t in (*m.MEASUREMENT_TABLES.values(), m.BenchRun)}


@FEW
@given(name=st.sampled_from(SMALL_FILES), cut=st.floats(0.0, 1.0), flips=st.lists(st.integers(0, 10**6), max_size=8),
       junk=st.binary(max_size=40))
def test_recorded_import_corrupted_bytes(record, recorded_dir, small_db, name, cut, flips, junk):
    """Truncated/bit-flipped/junk-appended copies of a recorded file: imported, or refused with no write."""
    record("fuzz_examples")
    raw = bytearray((recorded_dir / name).read_bytes())
    raw = raw[: max(1, int(len(raw) * cut))] if cut < 0.98 else raw
    for f in flips:
        raw[f % len(raw)] ^= 0x5A
    raw += junk
    _import_and_check(small_db, name, bytes(raw))


CELLS = st.one_of(st.none(), st.integers(-2**63, 2**64), st.floats(allow_nan=True, allow_infinity=True),
                  st.text(max_size=10), st.sampled_from(["OK", "OOM", "nan", "-inf", "0", "1e400", "x'; DROP TABLE"]))


@FEW
@given(name=st.sampled_from(("vocab_gemm_ce_b200.csv", "topk_a100.csv", "dispatch_gap_b200.csv")),
       edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 100), CELLS), min_size=1, max_size=6),
       drop_col=st.one_of(st.none(), st.integers(0, 100)))
def test_recorded_import_hostile_cells(record, recorded_dir, small_db, name, edits, drop_col):
    """A recorded CSV with random cells replaced (or a column dropped): imported, or refused with no write."""
    record("fuzz_examples")
    df = pd.read_csv(recorded_dir / name).astype(object)
    for r, c, v in edits:
        df.iat[r % len(df), c % df.shape[1]] = v
    if drop_col is not None:
        df = df.drop(columns=df.columns[drop_col % df.shape[1]])
    _import_and_check(small_db, name, df.to_csv(index=False).encode())


def _import_and_check(url: str, name: str, data: bytes) -> None:
    before = _counts(url)
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / name).write_bytes(data)
        try:
            with dbs.session_scope(url) as s:
                res = import_scaleplan_dir(s, d)
        except ScaleplanError as e:
            _one_line_error(e)
            assert _counts(url) == before  # no partial write
            return
    after = _counts(url)
    added = sum(after[t] - before[t] for t in after if t != "bench_run")
    assert added == sum(r.inserted for r in res)
    _delete_runs(url, [rid for r in res for rid in r.run_ids])  # keep the module's DB small


def _delete_runs(url: str, run_ids: list[int]) -> None:
    with dbs.session_scope(url) as s:
        for t in m.MEASUREMENT_TABLES.values():
            s.execute(t.__table__.delete().where(t.run_id.in_(run_ids)))
        s.execute(m.BenchRun.__table__.delete().where(m.BenchRun.id.in_(run_ids)))


# --- CSV importers of other commands (calibrate add, law fit) -----------------------------------

def _obs_count(url: str) -> tuple[int, int, int]:
    with dbs.session_scope(url) as s:
        return (s.scalar(select(func.count()).select_from(m.ObservedRun)),
                s.scalar(select(func.count()).select_from(m.LawRun)),
                s.scalar(select(func.count()).select_from(m.LawFit)))


@FEW
@given(edits=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 100), CELLS), min_size=1, max_size=5))
def test_calibrate_add_hostile_csv(record, cli, validation_dir, small_db, edits):
    record("fuzz_examples")
    df = pd.read_csv(validation_dir / "mfu_sweeps.csv").head(12).astype(object)
    for r, c, v in edits:
        df.iat[r % len(df), c % df.shape[1]] = v
    before = _obs_count(small_db)
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "runs.csv"
        df.to_csv(p, index=False)
        code, out, err = _cli_ok_or_one_line(cli, "calibrate", "add", str(p), "--specs",
                                             str(validation_dir / "models.yaml"), "--db", small_db, "--json")
    if code != 0:
        assert _obs_count(small_db) == before


LAW_COLS = ["n_tot", "n_act", "s", "g", "d", "loss"]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(st.lists(CELLS, min_size=6, max_size=6), min_size=0, max_size=6),
       header=st.one_of(st.just(LAW_COLS), st.permutations(LAW_COLS), st.lists(st.text(max_size=5), max_size=6)))
def test_law_fit_hostile_csv(record, cli, small_db, rows, header):
    record("fuzz_examples")
    before = _obs_count(small_db)
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "law.csv"
        pd.DataFrame(rows, columns=header[:6] + [f"c{i}" for i in range(6 - len(header[:6]))]).to_csv(p, index=False)
        code, out, err = _cli_ok_or_one_line(cli, "law", "fit", str(p), "--db", small_db, "--json")
    if code != 0:
        assert _obs_count(small_db) == before


def test_real_processes_reject_in_one_line(spec_file, tmp_path):
    """A few rejections through the installed entry point: exit 2, one stderr line, no traceback."""
    import subprocess
    import sys

    exe = Path(sys.executable).with_name("scaleplan")
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-c", "from scaleplan.cli import main; main()"]
    db = str(tmp_path / "p.db")
    for argv in (["db", "bogus"], ["db", "status", "--nope"], ["estimate", str(spec_file), "--devices", "abc"],
                 ["db", "status", "--db", "mysql://u:pw@127.0.0.1/x"],
                 ["db", "import-scaleplan", str(tmp_path / "[/x]"), "--db", db]):
        r = subprocess.run([*cmd, *argv], capture_output=True, text=True, timeout=budget(120), check=False)
        assert r.returncode == 2, (argv, r.stderr)
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1, (argv, r.stderr)
