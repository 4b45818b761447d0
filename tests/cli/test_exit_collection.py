"""The console script leaves its objects to the process's end (cli._skip_exit_collection); in-process callers
(tests, embedding programs) keep a collector that still reaches every object."""
from __future__ import annotations

import gc
import subprocess
import sys

from scaleplan.cli import main


def test_console_script_freezes_at_exit():
    # an exit hook registered before main runs after main's own (atexit runs the last registered first)
    code = ("import atexit, gc, sys\n"
            "atexit.register(lambda: print('frozen', gc.get_freeze_count() > 0))\n"
            "from scaleplan.cli import main\n"
            "sys.argv = ['scaleplan', '--help']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "frozen True"


def test_in_process_main_leaves_the_collector_alone():
    import atexit

    before = gc.get_freeze_count()
    calls = []
    real = atexit.register
    atexit.register = lambda f, *a, **k: calls.append(f) or f
    try:
        try:
            main(["--help"])
        except SystemExit:
            pass
    finally:
        atexit.register = real
    assert gc.get_freeze_count() == before and gc.freeze not in calls
