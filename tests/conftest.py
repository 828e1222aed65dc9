"""Suite-wide guard: no test reaches outside the environment it runs in.

A subprocess started from the base interpreter, or a venv made with
``--system-site-packages``, sees whatever was installed on the machine by hand; the
test then passes here and fails on a fresh machine. Both are refused at spawn time.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

_IN_VENV = sys.prefix != sys.base_prefix
_BASE_PYTHON = Path(getattr(sys, "_base_executable", sys.executable)).resolve()


class OutsideEnvironmentError(AssertionError):
    """A test tried to run code that sees packages outside the test environment."""


def _argv(args: Any) -> list[str]:
    if isinstance(args, str | bytes | os.PathLike):
        return [os.fsdecode(args)]
    return [os.fsdecode(a) for a in args]


def check_argv(argv: Sequence[str]) -> None:
    """Raise if argv would see site-packages outside the running environment."""
    if "--system-site-packages" in argv:
        raise OutsideEnvironmentError(
            f"{argv!r}: a venv with --system-site-packages sees the base interpreter's "
            "packages, which a fresh machine does not have"
        )
    if not _IN_VENV or not argv:
        return
    program = Path(argv[0])
    if not program.is_absolute() or not program.exists():
        return
    in_some_venv = (program.parent.parent / "pyvenv.cfg").is_file()
    if program.resolve() == _BASE_PYTHON and not in_some_venv:
        raise OutsideEnvironmentError(
            f"{argv!r}: runs the base interpreter, outside the test venv; use sys.executable"
        )


@pytest.fixture(autouse=True, scope="session")
def _no_reaching_outside() -> Iterator[None]:
    original = subprocess.Popen.__init__

    def guarded(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
        check_argv(_argv(args))
        original(self, args, *rest, **kwargs)

    subprocess.Popen.__init__ = guarded  # type: ignore[method-assign]
    try:
        yield
    finally:
        subprocess.Popen.__init__ = original  # type: ignore[method-assign]
