"""The CLI makes idle OpenMP threads sleep (scaleplan/cli/__init__.py), unless the user chose a policy:
spinning threads on a shared CPU stretched a CPU `validate --bench` from about a minute to over ten."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

CODE = "import os, scaleplan.cli; print(os.environ.get('OMP_WAIT_POLICY'))"


@pytest.mark.parametrize("given,want", [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_cli_sets_the_openmp_wait_policy_unless_given(given, want):
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if given is not None:
        env["OMP_WAIT_POLICY"] = given
    p = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env, check=True)
    assert p.stdout.strip() == want
