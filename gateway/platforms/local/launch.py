"""Replica launcher: joins the replica's cgroup, ties its life to Sluice's, then execs the command.

Run by the pool as ``python -I -S launch.py <sluice_pid> [--procs FILE]... [--uid N --gid N
--groups N,N...] [--cwd DIR] -- <command...>`` (stdlib only, no package imports, so it starts in
milliseconds).  Before ``execvp``:

1. Write its own pid into every ``cgroup.procs`` file given, so the command runs under its
   CPU and memory limits from its first instruction (children it forks inherit the cgroup).
2. Drop to the replica's user: ``setgroups``, ``setgid``, ``setuid`` (in that order), after
   clearing the ambient capability set; from then on it cannot leave its cgroup.
3. ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` (after the drop: a credential change clears it): if
   Sluice dies (even by SIGKILL), the kernel kills the replica; the setting survives
   ``execve``.  If Sluice is already gone, exit at once.
4. ``prctl(PR_SET_NO_NEW_PRIVS, 1)``: neither the command nor anything it runs can gain
   privileges through ``execve`` (setuid/setgid binaries, file capabilities), as a kubelet
   does for ``allowPrivilegeEscalation: false``; inherited across ``fork`` and ``execve``.
5. ``chdir`` to the working directory, as the replica's user.

The pool starts this in a new session (``setsid``), so the replica leads its own process
group and can be stopped with everything it spawned.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
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
    options: dict[str, list[str]] = {}
    for i, arg in enumerate(head):
        if arg.startswith("--") and i + 1 < len(head):
            options.setdefault(arg[2:], []).append(head[i + 1])

    pid = str(os.getpid())
    for path in options.get("procs", []):
        try:
            with open(path, "w", encoding="ascii") as f:
                f.write(pid)
        except OSError as e:
            _fail(f"cannot join cgroup {path}: {e.strerror}")

    libc = ctypes.CDLL(None, use_errno=True)
    if "uid" in options:
        uid, gid = int(options["uid"][0]), int(options["gid"][0])
        groups = [int(g) for g in options.get("groups", [""])[0].split(",") if g]
        libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)  # EINVAL before 4.3: none
        try:
            os.setgroups(groups or [gid])
            os.setgid(gid)
            os.setuid(uid)
        except OSError as e:
            _fail(f"cannot become uid {uid} gid {gid}: {e.strerror}")

    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        _fail(f"prctl(PR_SET_PDEATHSIG) failed: {os.strerror(ctypes.get_errno())}")
    if os.getppid() != parent_pid:
        _fail("Sluice exited before the replica started")
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        _fail(f"prctl(PR_SET_NO_NEW_PRIVS) failed: {os.strerror(ctypes.get_errno())}")

    if "cwd" in options:
        try:
            os.chdir(options["cwd"][0])
        except OSError as e:
            _fail(f"cannot enter working directory {options['cwd'][0]}: {e.strerror}")

    try:
        os.execvp(command[0], command)
    except OSError as e:
        _fail(f"cannot run {command[0]!r}: {e.strerror}")


if __name__ == "__main__":
    main(sys.argv[1:])
