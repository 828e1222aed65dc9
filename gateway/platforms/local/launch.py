"""Replica launcher: joins the replica's cgroup, ties its life to Sluice's, then execs the command.

Run by the pool as ``python -I -S launch.py <sluice_pid> [--procs FILE]... -- <command...>``
(stdlib only, no package imports, so it starts in milliseconds).  Before ``execvp``:

1. ``prctl(PR_SET_PDEATHSIG, SIGKILL)``: if Sluice dies (even by SIGKILL), the kernel kills
   the replica; the setting survives ``execve``.  If Sluice is already gone, exit at once.
2. Write its own pid into every ``cgroup.procs`` file given, so the command runs under its
   CPU limit from its first instruction (children it forks inherit the cgroup).

The pool starts this in a new session (``setsid``), so the replica leads its own process
group and can be stopped with everything it spawned.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
EXIT_LAUNCH_FAILED = 127


def _fail(message: str) -> None:
    sys.stderr.write(f"sluice launcher: {message}\n")
    sys.stderr.flush()
    os._exit(EXIT_LAUNCH_FAILED)


def main(argv: list[str]) -> None:
    if "--" not in argv or len(argv) < 3:
        _fail("usage: launch.py <sluice_pid> [--procs FILE]... -- <command...>")
    split = argv.index("--")
    head, command = argv[:split], argv[split + 1 :]
    if not command:
        _fail("no command given")
    parent_pid = int(head[0])
    procs = [head[i + 1] for i, arg in enumerate(head) if arg == "--procs" and i + 1 < len(head)]

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        _fail(f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(ctypes.get_errno())}")
    if os.getppid() != parent_pid:
        _fail("Sluice exited before the replica started")

    pid = str(os.getpid())
    for path in procs:
        try:
            with open(path, "w", encoding="ascii") as f:
                f.write(pid)
        except OSError as e:
            _fail(f"cannot join cgroup {path}: {e.strerror}")

    try:
        os.execvp(command[0], command)
    except OSError as e:
        _fail(f"cannot run {command[0]!r}: {e.strerror}")


if __name__ == "__main__":
    main(sys.argv[1:])
