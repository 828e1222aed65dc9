"""The suite's guard against tests that reach outside their environment (tests/conftest.py)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import OutsideEnvironmentError, check_argv


def test_a_venv_that_sees_the_base_interpreters_packages_is_refused() -> None:
    with pytest.raises(OutsideEnvironmentError, match="system-site-packages"):
        check_argv([sys.executable, "-m", "venv", "--system-site-packages", "/nowhere"])


def test_the_guard_is_active_for_every_spawn() -> None:
    with pytest.raises(OutsideEnvironmentError):
        subprocess.run(["true", "--system-site-packages"], check=False)


def test_the_running_interpreter_is_allowed() -> None:
    check_argv([sys.executable, "-c", "pass"])
    out = subprocess.run([sys.executable, "-c", "print(1)"], capture_output=True, check=True)
    assert out.stdout == b"1\n"


@pytest.mark.skipif(sys.prefix == sys.base_prefix, reason="only meaningful inside a venv")
def test_the_base_interpreter_is_refused_inside_a_venv() -> None:
    base = getattr(sys, "_base_executable", sys.executable)
    with pytest.raises(OutsideEnvironmentError, match="base interpreter"):
        check_argv([base, "-c", "pass"])
