"""The CLI run in the test process: what a subprocess test checks (exit status, stdout, one-line
stderr) without a new interpreter importing numpy, pandas, SQLAlchemy and the tables again (about
1.5 s of CPU per call). A few tests keep real processes, for what only a process shows (the console
script's exit status, no torch import in a planner command)."""
from __future__ import annotations

import contextlib
import io
import subprocess


def cli(*args: str) -> subprocess.CompletedProcess:
    """``scaleplan ARGS`` in-process (``scaleplan.cli.main``), as a CompletedProcess. Output is caught
    by swapping sys.stdout/sys.stderr, which the rich consoles and typer.echo look up at print time."""
    from scaleplan.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([str(a) for a in args])
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())
