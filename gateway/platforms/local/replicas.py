"""One replica process: launched in its own session and cgroup, stopped with SIGTERM then SIGKILL.

The process is started through ``launch.py`` (joins the cgroup, drops to the replica's
user, sets PR_SET_PDEATHSIG so it dies with Sluice, enters its working directory, then execs
the command) with a clean environment (:func:`~gateway.platforms.local.identity.replica_env`),
in a new session so the replica leads its
own process group: stopping signals the whole group, then anything left in its cgroup.
Its stdout and stderr are read line by line and logged (logger ``gateway.replicas.output``)
prefixed with the replica's name, so the output of several replicas stays apart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from gateway.platforms.local.cgroups import ReplicaCgroup
from gateway.platforms.local.identity import Identity, replica_env

log = logging.getLogger(__name__)
output_log = logging.getLogger("gateway.replicas.output")

MAX_LINE_BYTES = 16384
"""A longer line of replica output is logged in pieces of this size."""

LAUNCHER = Path(__file__).with_name("launch.py")


def render_command(command: Sequence[str], port: int) -> list[str]:
    """The command with ``{port}`` replaced by the replica's port and ``{python}`` by the
    interpreter running Sluice (so a bundled app runs in Sluice's own environment)."""
    return [arg.replace("{port}", str(port)).replace("{python}", sys.executable) for arg in command]


class ReplicaProcess:
    """A child process serving one replica on ``host:port``."""

    def __init__(
        self,
        service: str,
        name: str,
        port: int,
        command: Sequence[str],
        env: Mapping[str, str],
        *,
        cgroup: ReplicaCgroup | None = None,
        host: str = "127.0.0.1",
        identity: Identity | None = None,
        workdir: Path | None = None,
    ) -> None:
        self.service = service
        self.name = name
        self.host = host
        self.port = port
        self.argv = render_command(command, port)
        self.env = replica_env(env, port, workdir, os.environ)
        self.cgroup = cgroup
        self.identity = identity
        """None: the replica runs as Sluice's own user."""
        self.workdir = workdir
        self._proc: asyncio.subprocess.Process | None = None
        self._pumps: list[asyncio.Task[None]] = []

    def __repr__(self) -> str:
        state = "not started" if self._proc is None else f"pid {self.pid}, rc {self.returncode}"
        return f"ReplicaProcess({self.name} {self.address}, {state})"

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.returncode

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    async def start(self) -> None:
        """Spawn the process (raise OSError if it cannot be spawned at all)."""
        if self._proc is not None:
            raise RuntimeError(f"{self!r} was already started")
        procs: list[str] = []
        if self.cgroup is not None:
            for f in self.cgroup.join_files:
                procs += ["--procs", str(f)]
        if self.identity is not None:
            procs += self.identity.launcher_args()
        if self.workdir is not None:
            procs += ["--cwd", str(self.workdir)]
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            "-S",
            str(LAUNCHER),
            str(os.getpid()),
            *procs,
            "--",
            *self.argv,
            env=self.env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            limit=MAX_LINE_BYTES,
        )
        loop = asyncio.get_running_loop()
        for stream, label in ((self._proc.stdout, "stdout"), (self._proc.stderr, "stderr")):
            if stream is not None:
                self._pumps.append(loop.create_task(self._pump(stream, label)))
        log.info(
            "started %s %s: pid %d as %s: %s",
            self.service,
            self.name,
            self._proc.pid,
            "Sluice's user" if self.identity is None else self.identity.name,
            self.argv,
        )

    async def _pump(self, stream: asyncio.StreamReader, label: str) -> None:
        """Log every line the replica writes to ``label``, prefixed with its name."""
        extra = {"service": self.service, "replica": self.name, "stream": label}
        while True:
            try:
                raw = await stream.readline()
            except ValueError:  # a line longer than MAX_LINE_BYTES: log what is buffered
                raw = await stream.read(MAX_LINE_BYTES)
            if not raw:
                return
            line = raw.decode(errors="replace").rstrip("\r\n")
            output_log.info("[%s] %s", self.name, line, extra=extra)

    async def _drain_output(self) -> None:
        """Wait until the output pumps have logged everything the process wrote."""
        pumps, self._pumps = self._pumps, []
        for pump in pumps:
            try:
                async with asyncio.timeout(5):
                    await pump
            except TimeoutError:  # a grandchild holds the pipe open: stop reading it
                pump.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pump
            except OSError as e:
                log.warning("%s %s: reading its output failed: %s", self.service, self.name, e)

    async def wait(self) -> int:
        if self._proc is None:
            raise RuntimeError(f"{self!r} was never started")
        code = await self._proc.wait()
        await self._drain_output()
        return code

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the replica's process group (everything it spawned in its session)."""
        if self._proc is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._proc.pid, sig)

    async def stop(self, grace_s: float) -> int | None:
        """SIGTERM the process group, SIGKILL it after ``grace_s``; then kill leftovers in the cgroup."""
        if self._proc is None:
            return None
        if self._proc.returncode is None:
            self.signal_group(signal.SIGTERM)
            try:
                async with asyncio.timeout(grace_s):
                    await self._proc.wait()
            except TimeoutError:
                log.warning(
                    "%s %s did not exit %gs after SIGTERM: SIGKILL",
                    self.service,
                    self.name,
                    grace_s,
                )
                self.signal_group(signal.SIGKILL)
                await self._proc.wait()
        # The leader is gone; its group or cgroup may still hold processes it spawned.
        self.signal_group(signal.SIGKILL)
        if self.cgroup is not None:
            with contextlib.suppress(OSError):
                self.cgroup.kill_all(signal.SIGKILL)
        await self._drain_output()
        return self._proc.returncode
