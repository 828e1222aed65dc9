"""Who replicas run as, where, with which environment and memory bound: the pure parts
(config, byte units, the clean environment, the pre-flight over real file modes)."""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gateway.platforms.local.cgroups import parse_bytes
from gateway.platforms.local.identity import (
    PASSED_ENV,
    Identity,
    check_warnings,
    choose_identity,
    default_identity,
    default_workdir,
    preflight,
    replica_env,
    resolve,
)
from gateway.settings import ConfigError, parse_settings

NOBODY_LIKE = Identity("someone", 54321, 54321, (54321,))


def local_replicas(**over: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"command": ["app", "{port}"], "port_range": [9100, 9119]}
    spec.update(over)
    return {"platform": "local", "services": {"api": {"replicas": spec}}}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("256Mi", 256 * 1024**2),
        ("1G", 10**9),
        ("1gi", 1024**3),
        ("512KiB", 512 * 1024),
        ("4096", 4096),
        (1000, 1000),
    ],
)
def test_byte_counts_take_decimal_and_binary_units(text: str | int, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("bad", ["", "12X", "Mi", "-1", "0", "1.5G", True])
def test_bad_byte_counts_are_refused(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"256Mi|> 0"):
        parse_bytes(bad)


def test_memory_and_user_settings_load() -> None:
    settings = parse_settings(
        local_replicas(memory_max="256Mi", memory_high="200Mi", user="nobody", group=65534)
    )
    spec = settings.services["api"].replicas
    assert spec is not None
    assert spec.memory_max_bytes == 256 * 1024**2
    assert spec.memory_high_bytes == 200 * 1024**2
    assert (spec.user, spec.group, spec.workdir) == ("nobody", 65534, None)


@pytest.mark.parametrize(
    ("over", "expected"),
    [
        (
            {"memory_max": "64Mi", "memory_high": "128Mi"},
            "cfg.yaml: services.api.replicas.memory_high: must be <= memory_max (64Mi), got 128Mi",
        ),
        ({"memory_max": "lots"}, "cfg.yaml: services.api.replicas.memory_max"),
        (
            {"workdir": "relative/dir"},
            "cfg.yaml: services.api.replicas.workdir: must be an absolute",
        ),
        ({"user": -1}, "cfg.yaml: services.api.replicas.user"),
        ({"group": "a:b"}, "cfg.yaml: services.api.replicas.group"),
    ],
)
def test_bad_isolation_settings_name_the_key(over: dict[str, Any], expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_settings(local_replicas(**over), "cfg.yaml")
    assert any(p.startswith(expected) for p in info.value.problems), info.value.problems


def test_the_environment_is_clean() -> None:
    sluice_env = {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "SLUICE_ADMIN_TOKEN": "secret",
        "KUBECONFIG": "/root/.kube/config",
        "AWS_SECRET_ACCESS_KEY": "x",
        "HOME": "/root",
    }
    env = replica_env({"APP_MODE": "prod", "PORT": "1"}, 9100, Path("/srv/api"), sluice_env)
    assert env == {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": "/srv/api",
        "APP_MODE": "prod",
        "PORT": "9100",
    }
    assert set(PASSED_ENV) == {"PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ"}


def test_default_workdir_is_per_service() -> None:
    assert default_workdir("api/v1", 0, "/root") == Path("/var/lib/sluice/replicas/api_v1")
    assert default_workdir("api", 1000, "/home/me") == Path(
        "/home/me/.local/state/sluice/replicas/api"
    )


@pytest.fixture
def open_tmp() -> Iterator[Path]:
    """A directory in /tmp that every user can search (pytest's tmp_path is 0700)."""
    d = Path(tempfile.mkdtemp(prefix="sluice-preflight-", dir="/tmp"))
    try:
        yield d
    finally:
        shutil.rmtree(d)


def _tree(tmp_path: Path, dir_mode: int) -> Path:
    top = tmp_path / "opt"
    bin_dir = top / "bin"
    bin_dir.mkdir(parents=True)
    program = bin_dir / "app"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o755)
    top.chmod(dir_mode)
    tmp_path.chmod(0o755)
    return program


def test_preflight_names_the_directory_another_user_cannot_search(open_tmp: Path) -> None:
    tmp_path = open_tmp
    program = _tree(tmp_path, 0o700)
    why = preflight([str(program)], None, NOBODY_LIKE)
    assert why is not None
    assert f"{tmp_path / 'opt'} is not searchable by someone" in why


def test_preflight_passes_a_program_everyone_can_run(open_tmp: Path) -> None:
    tmp_path = open_tmp
    program = _tree(tmp_path, 0o755)
    if not all(os.stat(p).st_mode & stat.S_IXOTH for p in tmp_path.parents):
        pytest.skip(f"a parent of {tmp_path} is not searchable by others")
    assert preflight([str(program)], None, NOBODY_LIKE) is None
    program.chmod(0o744)
    assert preflight([str(program)], None, NOBODY_LIKE) == f"{program} is not executable by someone"


def test_preflight_finds_programs_on_path() -> None:
    assert preflight(["no-such-program-anywhere"], "/usr/bin", NOBODY_LIKE) == (
        "'no-such-program-anywhere' is not on PATH"
    )


def test_non_root_sluice_keeps_its_own_user() -> None:
    assert choose_identity("api", ["app"], None, None, euid=1000, path_env=None).identity is None
    ignored = choose_identity("api", ["app"], "nobody", None, euid=1000, path_env=None)
    assert ignored.identity is None
    assert ignored.warning is not None and "ignored" in ignored.warning


def test_explicit_root_runs_as_root_and_check_warns() -> None:
    choice = choose_identity("api", ["sh"], "root", None, euid=0, path_env="/usr/bin:/bin")
    assert choice.identity is None
    assert choice.warning is None
    warnings = check_warnings("api", ["sh"], "root", None, euid=0, path_env="/usr/bin:/bin")
    assert warnings == ["api: replicas.user is root: replicas run with every privilege of root"]


def test_an_unknown_user_is_reported() -> None:
    warnings = check_warnings(
        "api", ["sh"], "no-such-user-here", None, euid=0, path_env="/usr/bin:/bin"
    )
    assert warnings == ["api: replicas.user/group: no such user 'no-such-user-here'"]


def test_numeric_ids_resolve_without_a_passwd_entry() -> None:
    assert resolve(4242, 4343) == Identity("4242", 4242, 4343, (4343,))


def test_an_explicit_user_that_cannot_run_the_command_is_kept_with_a_warning(
    open_tmp: Path,
) -> None:
    program = _tree(open_tmp, 0o700)
    choice = choose_identity("api", [str(program)], "nobody", None, euid=0, path_env=None)
    assert choice.identity is not None and choice.identity.name == "nobody"
    assert choice.warning is not None
    assert choice.warning.startswith("api: replicas.user nobody may not be able to run the command")


@pytest.mark.skipif(default_identity() is None, reason="no user 'nobody'")
def test_without_replicas_user_root_is_refused_when_nobody_cannot_run_the_command(
    open_tmp: Path,
) -> None:
    """Never root unless ``replicas.user: root`` is written: the replicas are not started."""
    program = _tree(open_tmp, 0o700)
    choice = choose_identity("api", [str(program)], None, None, euid=0, path_env=None)
    assert choice.identity is None
    assert choice.refusal is not None
    assert choice.refusal.startswith("api: replicas NOT started: nobody cannot run the command")
    assert "replicas.user: root" in choice.refusal
    warnings = check_warnings("api", [str(program)], None, None, euid=0, path_env=None)
    assert warnings == [choice.refusal]
    explicit = choose_identity("api", [str(program)], "root", None, euid=0, path_env=None)
    assert explicit.identity is None and explicit.refusal is None, "written root is honoured"


@pytest.mark.skipif(default_identity() is None, reason="no user 'nobody'")
def test_the_refusal_names_a_venv_base_python_nobody_cannot_read(
    open_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A venv links to the Python it was made from: a venv in /opt/sluice made from a pyenv
    Python under /root (0700) still cannot be run by nobody, and the refusal says so."""
    python = _tree(open_tmp, 0o700)
    monkeypatch.setattr(sys, "executable", str(python))
    choice = choose_identity("api", ["{python}", "-m", "app"], None, None, euid=0, path_env=None)
    assert choice.refusal is not None
    assert f"made from a Python nobody can read too (this one runs {python})" in choice.refusal
    other = choose_identity("api", [str(python)], None, None, euid=0, path_env=None)
    assert other.refusal is not None and "made from a Python" not in other.refusal
