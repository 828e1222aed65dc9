"""The README's quick start: ``bash scripts/quickstart`` picks a Python the demo's replicas
can run (run in full it installs from the package index, which the suite does not reach)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "quickstart"


def test_the_readme_quick_start_runs_the_script() -> None:
    readme = (ROOT / "README.md").read_text()
    quick_start = readme[readme.index("## Quick start") :]
    assert "bash scripts/quickstart" in quick_start.split("```")[1]
    assert SCRIPT.is_file()


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("runuser") is None, reason="root picks for nobody"
)
def test_as_root_it_picks_a_python_nobody_can_run_and_make_a_venv_with() -> None:
    picked = subprocess.run(
        ["bash", str(SCRIPT), "--which-python"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()
    assert Path(picked).is_absolute(), picked
    probe = subprocess.run(
        [
            "runuser",
            "-u",
            "nobody",
            "--",
            picked,
            "-c",
            "import sys, venv, ensurepip; print(sys.version_info[:2])",
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.returncode == 0, probe.stderr
    assert tuple(int(x) for x in probe.stdout.strip("()\n").split(", ")) >= (3, 11)
