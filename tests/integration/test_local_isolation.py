"""Replicas on the local platform run unprivileged, in a directory of their own, with a clean
environment and a memory limit: checked from ``/proc/<pid>/`` and by what the replica can do.

The upstream is Debian's ``/usr/bin/python3`` (installed by ``.ci/run``) running a small HTTP
server given with ``-c``: ``nobody`` can run it, while the suite's own interpreter (under
``/root``) it cannot.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from gateway.platforms.local.identity import (
    PASSED_ENV,
    default_identity,
    default_workdir,
    preflight,
)
from gateway.platforms.local.pool import LocalPool
from gateway.platforms.local.state import ReplicaPhase, ReplicaStatus
from tests.support.localpool import Harness, get, needs_cgroups, run_harness, until
from tests.support.procs import MARKER_VAR

SYSTEM_PYTHON = "/usr/bin/python3"
SERVER = r"""
import os, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

hog = []

class H(BaseHTTPRequestHandler):
    def do_GET(self):
        url = urlparse(self.path)
        q = parse_qs(url.query)
        code, body = 200, str(os.getpid())
        if url.path.endswith("/read"):
            try:
                with open(q["path"][0]) as f:
                    body = f.read()
            except OSError as e:
                code, body = 403, e.strerror
        elif url.path.endswith("/child-alloc"):
            import subprocess
            child = subprocess.run(
                [sys.executable, "-I", "-c", "b = [bytearray(1 << 20) for _ in range(%s)]" % q["mb"][0]]
            )
            body = str(child.returncode)
        elif url.path.endswith("/alloc"):
            for _ in range(int(q["mb"][0])):
                hog.append(bytearray(b"\x01") * (1 << 20))
            body = "allocated"
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass

ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""
UPSTREAM = [SYSTEM_PYTHON, "-I", "-c", SERVER, "{port}"]


def _nobody_cannot_run_it() -> str | None:
    if os.geteuid() != 0:
        return "needs root (to drop replicas to another user)"
    who = default_identity()
    if who is None:
        return "no user 'nobody'"
    return preflight(UPSTREAM, os.environ.get("PATH"), who)


_WHY = _nobody_cannot_run_it()
needs_root_and_system_python = pytest.mark.skipif(_WHY is not None, reason=f"{_WHY}")
pytestmark = [needs_cgroups, needs_root_and_system_python]


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    async for h in run_harness():
        yield h


def _proc_ids(pid: int) -> dict[str, list[str]]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in {"Uid", "Gid", "Groups", "CapEff", "CapPrm", "CapAmb", "NoNewPrivs"}:
            out[key] = value.split()
    return out


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.decode().split("=", 1) for item in raw.split(b"\0") if item)


def _ready_pid(replicas: tuple[ReplicaStatus, ...]) -> int:
    for r in replicas:
        if r.phase is ReplicaPhase.READY and r.pid is not None:
            return r.pid
    raise AssertionError(f"no ready replica in {replicas}")


async def test_a_replica_runs_as_its_user_in_its_own_directory_with_a_clean_environment(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLUICE_ADMIN_TOKEN", "secret-admin-token")
    monkeypatch.setenv("KUBECONFIG", "/root/.kube/config")
    service = f"iso-{harness.marker[:8]}"
    pool = harness.pool({service: harness.spec(UPSTREAM, user="nobody")})
    workdir = default_workdir(service, 0, None)
    try:
        await _check_isolation(pool, service, workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


async def _check_isolation(pool: LocalPool, service: str, workdir: Path) -> None:
    async with pool:
        pool.scale(service, 1, 0.5)
        assert await until(lambda: pool.status(service).ready == 1)
        pid = _ready_pid(pool.status(service).replicas)
        who = default_identity()
        assert who is not None

        ids = _proc_ids(pid)
        assert ids["Uid"] == [str(who.uid)] * 4
        assert ids["Gid"] == [str(who.gid)] * 4
        assert ids["Groups"] == [str(g) for g in who.groups]
        assert int(ids["CapEff"][0], 16) == 0
        assert int(ids["CapPrm"][0], 16) == 0
        assert int(ids["CapAmb"][0], 16) == 0
        assert ids["NoNewPrivs"] == ["1"], "no setuid binary can give it privileges back"

        assert os.readlink(f"/proc/{pid}/cwd") == str(workdir)
        st = workdir.stat()
        assert (st.st_uid, st.st_gid) == (who.uid, who.gid)
        assert stat.S_IMODE(st.st_mode) == 0o700

        env = _environ(pid)
        assert "SLUICE_ADMIN_TOKEN" not in env
        assert "KUBECONFIG" not in env
        allowed = {*PASSED_ENV, "HOME", "PORT", MARKER_VAR, "PYTHONPATH"}
        assert set(env) <= allowed, set(env) - allowed
        assert env["HOME"] == str(workdir)
        assert env["PORT"] == pool.endpoints(service)[0].rsplit(":", 1)[1]

        status = pool.status(service)
        assert status.user == who.name
        assert status.workdir == str(workdir)


async def test_a_replica_as_nobody_cannot_read_a_file_only_root_can_read(
    harness: Harness,
) -> None:
    # In /tmp (searchable by everyone): only the files' own modes decide.
    secret = Path("/tmp") / f"sluice-secret-{uuid.uuid4().hex}"
    public = Path("/tmp") / f"sluice-public-{uuid.uuid4().hex}"
    secret.write_text("root only\n")
    secret.chmod(0o600)
    public.write_text("anyone\n")
    public.chmod(0o644)
    try:
        pool = harness.pool({"reader": harness.spec(UPSTREAM, user="nobody")})
        async with pool:
            pool.scale("reader", 1, 0.5)
            assert await until(lambda: pool.status("reader").ready == 1)
            address = pool.endpoints("reader")[0]
            denied = await get(address, f"/read?path={secret}")
            allowed = await get(address, f"/read?path={public}")
        assert denied.status_code == 403
        assert denied.text == "Permission denied"
        assert allowed.status_code == 200
        assert allowed.text == "anyone\n"
    finally:
        secret.unlink()
        public.unlink()


async def test_a_replica_past_memory_max_is_oom_killed_counted_and_restarted_while_others_serve(
    harness: Harness,
) -> None:
    pool = harness.pool(
        {
            "hog": harness.spec(UPSTREAM, user="nobody", memory_max="48Mi"),
            "calm": harness.spec(UPSTREAM, user="nobody", memory_max="48Mi"),
        }
    )
    async with pool:
        pool.scale("hog", 1, 0.5)
        pool.scale("calm", 1, 0.5)
        assert await until(lambda: pool.status("hog").ready == 1 and pool.status("calm").ready == 1)
        assert pool.status("hog").memory_applied
        assert pool.status("hog").memory_max_bytes == 48 * 1024 * 1024
        first_pid = _ready_pid(pool.status("hog").replicas)
        hog_address = pool.endpoints("hog")[0]

        with pytest.raises(httpx.HTTPError):
            await get(hog_address, "/alloc?mb=200")

        assert await until(lambda: pool.status("hog").oom_kills_total >= 1)
        assert await until(
            lambda: (
                pool.status("hog").ready == 1
                and _ready_pid(pool.status("hog").replicas) != first_pid
            )
        )
        hog = pool.status("hog")
        assert hog.restarts_total >= 1
        assert hog.replicas[0].oom_kills >= 1
        # The other service never noticed.
        calm = pool.status("calm")
        assert calm.oom_kills_total == 0
        assert calm.restarts_total == 0
        answer = await get(pool.endpoints("calm")[0], "/alloc?mb=8")
        assert answer.status_code == 200
        # The restarted replica serves again.
        again = await get(pool.endpoints("hog")[0], "/")
        assert again.status_code == 200


async def test_an_oom_kill_inside_a_running_replica_is_counted_while_it_runs(
    harness: Harness,
) -> None:
    """A worker process the replica forked goes past memory_max: the kernel kills the worker,
    the replica keeps serving, and the kill is reported live (not only when a replica exits)."""
    pool = harness.pool({"forks": harness.spec(UPSTREAM, user="nobody", memory_max="48Mi")})
    async with pool:
        pool.scale("forks", 1, 0.5)
        assert await until(lambda: pool.status("forks").ready == 1)
        pid = _ready_pid(pool.status("forks").replicas)
        answer = await get(pool.endpoints("forks")[0], "/child-alloc?mb=200")
        assert answer.text == "-9", "the worker was SIGKILLed by the OOM killer"
        assert await until(lambda: pool.status("forks").oom_kills_total >= 1)
        status = pool.status("forks")
        assert _ready_pid(status.replicas) == pid, "the replica itself kept running"
        assert status.restarts_total == 0
        assert status.replicas[0].oom_kills >= 1


async def test_without_replicas_user_no_replica_runs_as_root_when_nobody_cannot_run_it(
    harness: Harness,
) -> None:
    """Sluice runs as root; ``nobody`` cannot run the command; no ``replicas.user``: the
    service's replicas are refused (never root unless written), the others run."""
    hidden = Path(tempfile.mkdtemp(prefix="sluice-hidden-", dir="/tmp"))
    hidden.chmod(0o700)
    program = hidden / "server"
    program.write_text(f"#!{SYSTEM_PYTHON}\n" + SERVER)
    program.chmod(0o755)
    try:
        pool = harness.pool(
            {
                "hidden": harness.spec([str(program), "{port}"], user=None),
                "open": harness.spec(UPSTREAM, user=None),
            }
        )
        async with pool:
            pool.scale("hidden", 1, 0.5)
            pool.scale("open", 1, 0.5)
            assert await until(lambda: pool.status("open").ready == 1)
            hidden_status = pool.status("hidden")
            assert hidden_status.refused is not None
            assert "replicas NOT started: nobody cannot run the command" in hidden_status.refused
            assert hidden_status.ready == 0
            assert all(r.pid is None for r in hidden_status.replicas)
            opened = pool.status("open")
            assert opened.refused is None and opened.user == "nobody"
            assert _proc_ids(_ready_pid(opened.replicas))["Uid"][0] != "0"
    finally:
        shutil.rmtree(hidden)
