"""The README's quick start, as a new user runs it: a wheel built from this clone, installed
alone in a fresh virtualenv, the quick start's block run as pasted and the view it made
checked (``scripts/plain_install.sh``, which also runs the installed ``mvsink`` command)."""

from __future__ import annotations

import os
import subprocess

import pytest

from mvsink import __version__

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.newest_line
def test_the_readme_quick_start_runs_as_pasted_from_a_built_wheel():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYSPARK_", "VIRTUAL_ENV"))}
    done = subprocess.run(
        [os.path.join(ROOT, "scripts", "plain_install.sh")],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "quick start: the view holds [{'product': 'apple', 'revenue': 4.5}" in done.stdout
    assert f"mvsink {__version__}" in done.stdout and "view revenue: frontier 1" in done.stdout
