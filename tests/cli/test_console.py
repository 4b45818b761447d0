"""The console script (scaleplan/console.py): the collector tuned for a short-lived process before the CLI
runs; the `python -m scaleplan` form starts the same way."""
from __future__ import annotations

import gc
import subprocess
import sys


def test_the_collector_is_tuned_before_the_cli_runs(monkeypatch):
    from scaleplan import cli, console

    seen = []
    monkeypatch.setattr(cli, "main", lambda: seen.append(gc.get_threshold()))
    before = gc.get_threshold()
    try:
        console.main()
    finally:
        gc.set_threshold(*before)
    assert seen == [console.GC_THRESHOLDS] and console.GC_THRESHOLDS[0] > before[0]


def test_python_dash_m_runs_the_cli():
    out = subprocess.run([sys.executable, "-m", "scaleplan", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "layouts" in out.stdout


def test_a_command_runs_in_an_app_of_its_own_that_answers_as_the_whole_app():
    """cli.main builds the app of the command argv names alone (cli.build_app): the word after the global
    options (and --db's value) picks it; the help and an option error of a command read as the whole app's
    (scaleplan.cli.app); no command, --help and an unknown word get the whole app."""
    from typer.testing import CliRunner

    from scaleplan import cli

    name = cli._command_name
    assert name(["--db", "layouts", "--json", "search", "--nodes", "3"]) == "search"
    assert name(["--json", "db", "upgrade"]) == "db" and name(["--db=x.db", "plan"]) == "plan"
    assert name(["--help"]) is name(["layoutz", "x"]) is name([]) is name(["--db", "estimate"]) is None
    one = cli.build_app("layouts")
    assert [c.name for c in one.registered_commands] == ["layouts"] and not one.registered_groups
    assert {c.name for c in cli.app.registered_commands} | {g.name for g in cli.app.registered_groups} == set(
        cli.COMMANDS)
    for argv in (["layouts", "--help"], ["--json", "layouts", "--top", "x", "s.yaml"], ["db", "--help"]):
        whole, alone = (CliRunner().invoke(a, argv) for a in (cli.app, cli.build_app(name(argv))))
        assert (alone.exit_code, alone.output) == (whole.exit_code, whole.output), argv
