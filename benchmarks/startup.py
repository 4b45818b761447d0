"""Start-up time of whole `scaleplan` commands, as ratios to `python -c pass` (not a test; prints figures).

Each command runs as a fresh process (the installed console script next to this interpreter, so no
pyenv shim is timed), ``--repeat`` times, interleaved with the `python -c pass` baseline so a busy
spell of the machine hits both alike; the medians and their ratio are printed. The issue's budgets
are absolute (on an idle 2-core machine): `scaleplan --help` < 0.25 s, `layouts` of an 18B model on 512
GPUs < 0.8 s; the ratio is what carries over to a loaded machine. Then the slowest imports of
``scaleplan.cli`` by ``python -X importtime`` (cumulative microseconds), which is what `--help` pays for.

    python benchmarks/startup.py [--repeat 7] [--db URL] [--recorded DIR]

``--db``: the database `layouts` reads (default: a temporary SQLite with ../shared/recorded imported,
not timed; ``--recorded ''`` leaves it empty, every component analytic).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]

# an 18B-total MoE (N_act ~3.6B): 32 layers, d = 4096, 32 experts of 1408 (top-4) and a shared one
SPEC_18B = {
    "model": {"n_layers": 32, "hidden_sz": 4096, "inter_sz": 11264, "n_q_heads": 32, "n_kv_heads": 8,
              "head_dim": 128, "vocab_sz": 131072,
              "moe": {"n_experts": 32, "experts_per_token": 4, "expert_inter_sz": 1408,
                      "shared_expert_inter_sz": 1408}},
    "search": {"num_devices": 512},
    "data": {"gbs": 2048, "seqlen": 4096, "microbatch_sz": 1},
    "hardware": {"node_type": "p6-b200.48xlarge"},
}


def _scaleplan() -> list[str]:
    exe = Path(sys.executable).with_name("scaleplan")
    return [str(exe)] if exe.exists() else [sys.executable, "-c", "from scaleplan.cli import main; main()"]


def _wall(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - t0


def _import_top(n: int = 8) -> list[tuple[int, str]]:
    """(cumulative us, module) of the n slowest imports of scaleplan.cli, from -X importtime."""
    p = subprocess.run([sys.executable, "-X", "importtime", "-c", "import scaleplan.cli"],
                       capture_output=True, text=True, check=False)
    rows = []
    for line in p.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[1].strip().isdigit():
            rows.append((int(parts[1]), parts[2].rstrip()))
    return sorted(rows, reverse=True)[:n]


def _recorded_db(tmp: str, recorded: str) -> str:
    from scaleplan.db import session as dbs

    url = f"sqlite:///{tmp}/startup.db"
    dbs.upgrade(url)
    if recorded and Path(recorded).is_dir():
        from scaleplan.db.importers import import_scaleplan_dir

        with dbs.session_scope(url) as s:
            import_scaleplan_dir(s, recorded)
    dbs.get_engine(url).dispose()
    return url


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--db", default=None)
    ap.add_argument("--recorded", default=str(REPO.parent / "shared" / "recorded" / "dmlc-scaleplan"))
    a = ap.parse_args()

    sp = _scaleplan()
    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "m18b.yaml"
        spec.write_text(yaml.safe_dump(SPEC_18B))
        from _db import tables_db  # benchmarks/_db.py: a database without tables is refused in one line

        url = tables_db(a.db) if a.db else _recorded_db(tmp, a.recorded)
        commands = {
            "scaleplan --help": [*sp, "--help"],
            "scaleplan layouts (18B, 512 GPUs)": [*sp, "layouts", str(spec), "--devices", "512", "--db", url,
                                                  "--top", "3"],
        }
        for cmd in commands.values():  # warm the OS file cache and the tables' cache once, untimed
            _wall(cmd)
        base: list[float] = []
        times: dict[str, list[float]] = {k: [] for k in commands}
        for _ in range(a.repeat):
            base.append(_wall([sys.executable, "-c", "pass"]))
            for k, cmd in commands.items():
                times[k].append(_wall(cmd))
    b = statistics.median(base)
    print(f"python -c pass: median {b * 1e3:.0f} ms over {a.repeat} runs; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    for k, ts in times.items():
        m = statistics.median(ts)
        print(f"{k}: median {m * 1e3:.0f} ms = {m / b:.1f} x python -c pass (min {min(ts) * 1e3:.0f} ms)")
    print("slowest imports of scaleplan.cli (python -X importtime, cumulative):")
    for us, mod in _import_top():
        print(f"  {us / 1e3:7.1f} ms  {mod.strip()}")


if __name__ == "__main__":
    main()
