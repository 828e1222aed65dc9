"""The scenario suite's one command, run as a user runs it, on one scenario."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_one_command_prints_the_table_and_the_verdict_and_writes_json(tmp_path: Path) -> None:
    out, table = tmp_path / "suite.json", tmp_path / "suite.txt"
    done = subprocess.run(
        [
            sys.executable, str(ROOT / "benchmarks" / "scenarios" / "run.py"),
            "--only", "seed-2c-api-reports", "--jobs", "1", "--out", str(out), "--table", str(table),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    verdict = "verdict (Sluice on share, baselines on limit):"
    for text in ("seed-2c-api-reports", "p99 S/I", "best split", "dir/h", verdict):
        assert text in done.stdout
    doc = json.loads(out.read_text())
    (sc,) = doc["scenarios"]
    assert set(sc["runs"]) == {"sluice", "independent", "static", "best_split", "entitled"}
    assert {g["goal"] for g in sc["verdict"]} >= {
        "completed >= independent",
        "seed: CPU in contention >= 90 %",
        "seed: short-lived reports p99 >= 10x lower than independent",
    }
    assert verdict in table.read_text()
