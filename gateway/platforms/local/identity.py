"""Who a service's replicas run as, and where: the user/group to drop to, the pre-flight that
checks that user can run the command, the working directory and the clean environment.

* Sluice not root: replicas run as Sluice's own user (it could not change it anyway).
* Sluice root, ``replicas.user`` set: that user (``root`` written explicitly is allowed;
  ``sluice check`` warns about it).
* Sluice root, no ``replicas.user``: ``nobody``/``nogroup`` **if that user can run the
  command** (:func:`preflight`: every directory on the way to the program, and for
  ``{python}`` to the interpreter's prefixes and to the ``gateway`` package, searchable by it,
  the program executable by it); otherwise the replicas are **not started** (a refusal that
  says why and how to fix it): never root unless ``replicas.user: root`` is written, as a
  kubelet refuses ``runAsNonRoot`` rather than run the container as root.

The launcher (``launch.py``) does the drop itself: ``setgroups``, ``setgid``, ``setuid``.
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import stat
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

DEFAULT_USER = "nobody"
DEFAULT_GROUPS = ("nogroup", "nobody")
"""The default user's group: the first of these that exists (Debian: nogroup; Fedora: nobody)."""
PASSED_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ")
"""The only variables of Sluice's own environment a replica inherits (besides ``replicas.env``,
``PORT`` and ``HOME``, which is set to the replica's working directory)."""
ROOT_WORKDIR_BASE = Path("/var/lib/sluice/replicas")
GATEWAY_PACKAGE = Path(__file__).resolve().parents[2]
"""The ``gateway`` package: a ``{python}`` command (the demo) imports it."""


class IdentityError(Exception):
    """``replicas.user``/``replicas.group`` names no such user or group."""


@dataclass(frozen=True, slots=True)
class Identity:
    """The user and groups a replica runs as (None from :func:`choose_identity` = no change)."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]

    def launcher_args(self) -> list[str]:
        groups = ",".join(str(g) for g in self.groups)
        return ["--uid", str(self.uid), "--gid", str(self.gid), "--groups", groups]


@dataclass(frozen=True, slots=True)
class IdentityChoice:
    identity: Identity | None
    """None: run as Sluice's own user (no drop)."""
    warning: str | None = None
    refusal: str | None = None
    """Set: start no replica (they would run as root without ``replicas.user: root``)."""


def resolve(user: str | int, group: str | int | None) -> Identity:
    """The identity for ``user`` (name or uid) and ``group`` (name or gid; None = the user's
    primary group); supplementary groups are the user's own from the group database."""
    try:
        pw = pwd.getpwuid(user) if isinstance(user, int) else _getpwnam(user)
    except KeyError:
        if isinstance(user, int) or user.isdigit():
            uid = int(user)
            gid = _gid(group) if group is not None else uid
            return Identity(str(uid), uid, gid, (gid,))
        raise IdentityError(f"no such user {user!r}") from None
    gid = _gid(group) if group is not None else pw.pw_gid
    try:
        groups = tuple(sorted(set(os.getgrouplist(pw.pw_name, gid))))
    except OSError:
        groups = (gid,)
    return Identity(pw.pw_name, pw.pw_uid, gid, groups)


def _getpwnam(name: str) -> pwd.struct_passwd:
    if name.isdigit():
        return pwd.getpwuid(int(name))
    return pwd.getpwnam(name)


def _gid(group: str | int) -> int:
    if isinstance(group, int):
        return group
    if group.isdigit():
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise IdentityError(f"no such group {group!r}") from None


def default_identity() -> Identity | None:
    """``nobody`` with ``nogroup`` (or ``nobody``), without supplementary groups; None if absent."""
    try:
        pw = pwd.getpwnam(DEFAULT_USER)
    except KeyError:
        return None
    gid = pw.pw_gid
    for name in DEFAULT_GROUPS:
        try:
            gid = grp.getgrnam(name).gr_gid
            break
        except KeyError:
            continue
    return Identity(pw.pw_name, pw.pw_uid, gid, (gid,))


def program_path(command: Sequence[str], path_env: str | None) -> str | None:
    """The file ``command[0]`` runs (``{python}`` = this interpreter); None if not found."""
    program = command[0].replace("{python}", sys.executable)
    if "/" in program:
        return program
    return shutil.which(program, path=path_env)


def _may(st: os.stat_result, who: Identity, bits: tuple[int, int, int]) -> bool:
    if who.uid == 0:
        return True
    if st.st_uid == who.uid:
        return bool(st.st_mode & bits[0])
    if st.st_gid in who.groups or st.st_gid == who.gid:
        return bool(st.st_mode & bits[1])
    return bool(st.st_mode & bits[2])


_SEARCH = (stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH)
_READ = (stat.S_IRUSR, stat.S_IRGRP, stat.S_IROTH)


def _reachable(path: Path, who: Identity) -> str | None:
    """Why ``who`` cannot reach ``path`` (every directory above it searchable), or None."""
    for d in [*reversed(path.parents)]:
        try:
            st = d.stat()
        except OSError as e:
            return f"{d}: {e.strerror}"
        if not _may(st, who, _SEARCH):
            return f"{d} is not searchable by {who.name} (mode {stat.filemode(st.st_mode)})"
    return None


def preflight(command: Sequence[str], path_env: str | None, who: Identity) -> str | None:
    """Why ``who`` cannot run ``command``, or None when it can (as far as modes tell)."""
    program = program_path(command, path_env)
    if program is None:
        return f"{command[0]!r} is not on PATH"
    targets = [Path(program), Path(os.path.realpath(program))]
    for target in targets:
        why = _reachable(target, who)
        if why is not None:
            return f"{program}: {why}"
    real = targets[1]
    try:
        st = real.stat()
    except OSError as e:
        return f"{program}: {e.strerror}"
    if not _may(st, who, _SEARCH):
        return f"{real} is not executable by {who.name}"
    if any("{python}" in arg for arg in command):
        needed = [
            Path(sys.executable).parent,
            Path(sys.prefix),
            Path(sys.base_prefix),
            GATEWAY_PACKAGE,
        ]
        for d in needed:
            for p in (d, Path(os.path.realpath(d))):
                why = _reachable(p, who)
                if why is None:
                    st = p.stat()
                    if not (_may(st, who, _SEARCH) and _may(st, who, _READ)):
                        why = (
                            f"{p} is not readable by {who.name} (mode {stat.filemode(st.st_mode)})"
                        )
                if why is not None:
                    return f"{{python}} ({sys.executable}) needs {p}: {why}"
    return None


def choose_identity(
    service: str,
    command: Sequence[str],
    user: str | int | None,
    group: str | int | None,
    *,
    euid: int,
    path_env: str | None,
) -> IdentityChoice:
    """Who ``service``'s replicas run as (see the module docstring); raise IdentityError."""
    if euid != 0:
        if user is not None or group is not None:
            return IdentityChoice(
                None,
                f"{service}: replicas.user/group ignored: Sluice does not run as root, "
                "so replicas run as its own user",
            )
        return IdentityChoice(None)
    if user is not None:
        who = resolve(user, group)
        if who.uid == 0 and (group is None or who.gid == 0):
            return IdentityChoice(None)
        why = preflight(command, path_env, who)
        if why is not None:  # the user asked for this one: keep it, but say it will fail
            return IdentityChoice(
                who,
                f"{service}: replicas.user {who.name} may not be able to run the command: {why}",
            )
        return IdentityChoice(who)
    fallback = default_identity()
    if fallback is None:
        return IdentityChoice(
            None,
            refusal=f"{service}: replicas NOT started: there is no user {DEFAULT_USER!r} to run "
            "them as, and Sluice runs replicas as root only with replicas.user: root; set "
            "replicas.user to an unprivileged user",
        )
    who = fallback
    if group is not None:
        who = Identity(who.name, who.uid, _gid(group), (_gid(group),))
    why = preflight(command, path_env, who)
    if why is not None:
        return IdentityChoice(
            None,
            refusal=f"{service}: replicas NOT started: {who.name} cannot run the command "
            f"({why}), and Sluice runs replicas as root only with replicas.user: root; install "
            f"the program (for {{python}}: {_python_advice(command, who)}) where {who.name} can "
            "read it, or set replicas.user to a user that can run it",
        )
    return IdentityChoice(who)


def _python_advice(command: Sequence[str], who: Identity) -> str:
    """How to install Python and Sluice so ``who`` can run ``{python}``: a venv links to the
    Python it was made from, so when that one is out of reach (a pyenv Python under /root),
    say so and name one to make the venv from."""
    advice = "Python and Sluice, e.g. a venv in /opt/sluice"
    base = Path(os.path.realpath(sys.executable))
    if not any("{python}" in arg for arg in command) or _reachable(base, who) is None:
        return advice
    advice += f" made from a Python {who.name} can read too (this one runs {base})"
    system = Path("/usr/bin/python3")
    if system.exists() and _reachable(Path(os.path.realpath(system)), who) is None:
        advice += f": {system} -m venv /opt/sluice, or bash scripts/quickstart in the checkout"
    return advice


def explicit_root(user: str | int | None) -> bool:
    return user in (0, "0", "root")


def check_warnings(
    service: str,
    command: Sequence[str],
    user: str | int | None,
    group: str | int | None,
    *,
    euid: int,
    path_env: str | None,
) -> list[str]:
    """What ``sluice check`` warns about how ``service``'s replicas would run (started by a
    Sluice with effective uid ``euid``): as root, explicitly or by fallback, or a user that
    does not exist."""
    if explicit_root(user):
        return [f"{service}: replicas.user is root: replicas run with every privilege of root"]
    try:
        choice = choose_identity(service, command, user, group, euid=euid, path_env=path_env)
    except IdentityError as e:
        return [f"{service}: replicas.user/group: {e}"]
    return [m for m in (choice.refusal, choice.warning) if m is not None]


def default_workdir(service: str, euid: int, home: str | None) -> Path:
    """The per-service working directory Sluice creates when ``replicas.workdir`` is unset."""
    base = (
        ROOT_WORKDIR_BASE
        if euid == 0
        else Path(home or "/tmp") / ".local" / "state" / "sluice" / "replicas"
    )
    return base / service.replace("/", "_")


def prepare_workdir(path: Path, who: Identity | None) -> None:
    """Create ``path`` (parents 0755) owned by ``who`` (mode 0700); raise OSError."""
    for parent in reversed(path.parents):
        if not parent.exists():
            parent.mkdir(mode=0o755)
    path.mkdir(mode=0o700, exist_ok=True)
    if who is not None:
        st = path.stat()
        if (st.st_uid, st.st_gid) != (who.uid, who.gid):
            os.chown(path, who.uid, who.gid)


def replica_env(
    extra: Mapping[str, str], port: int, workdir: Path | None, sluice_env: Mapping[str, str]
) -> dict[str, str]:
    """The clean environment of a replica: :data:`PASSED_ENV` from Sluice's, ``HOME`` (the
    working directory), then ``replicas.env``, then ``PORT``.  Nothing else of Sluice's (no
    admin token, no kubeconfig path) reaches it."""
    env = {k: sluice_env[k] for k in PASSED_ENV if k in sluice_env}
    if workdir is not None:
        env["HOME"] = str(workdir)
    env.update(extra)
    env["PORT"] = str(port)
    return env


__all__ = [
    "PASSED_ENV",
    "Identity",
    "IdentityChoice",
    "IdentityError",
    "check_warnings",
    "choose_identity",
    "default_identity",
    "default_workdir",
    "explicit_root",
    "preflight",
    "prepare_workdir",
    "replica_env",
    "resolve",
]
