"""Find processes through /proc: the ground truth for "no orphans left behind"."""

from __future__ import annotations

import os
import time
from pathlib import Path

MARKER_VAR = "SLUICE_TEST_MARKER"


def pids_with_marker(marker: str) -> list[int]:
    """Every live (non-zombie) process whose environment has ``SLUICE_TEST_MARKER=<marker>``."""
    needle = f"{MARKER_VAR}={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return sorted(found)


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_until(predicate: object, timeout_s: float = 20.0, pause_s: float = 0.02) -> bool:
    """Poll ``predicate()`` until true or ``timeout_s`` passes (bounded polling, not a timed assertion)."""
    assert callable(predicate)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(pause_s)
    return bool(predicate())


def own_children() -> list[int]:
    """Direct children of this process."""
    me = os.getpid()
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == me:
            out.append(int(entry.name))
    return out
