"""The README's commands stay true: CI runs exactly the README's test command."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ci_runs_the_readme_test_command() -> None:
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    blocks = re.findall(r"```sh\n(.*?)\n```", readme, re.S)
    assert len(blocks) >= 2, "README quick start must give a run command and a test command"
    test_command = next(b for b in blocks if "pytest" in b).strip()
    pytest_part = test_command.rsplit("&&", 1)[-1].strip()
    assert pytest_part.startswith("python -m pytest")
    assert pytest_part in ci.splitlines(), (
        f".ci/run must run the README's test command {pytest_part!r}"
    )
