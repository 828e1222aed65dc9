"""Real processes for integration and e2e tests: upstream servers and the gateway itself.

Both are started the way a user would (``python -m ...``) on 127.0.0.1 with port 0; the
bound addresses are read from the line each prints when ready.  Every process is stopped
(and waited for) when its context ends, so no test leaves one behind.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 20.0


class Process:
    def __init__(
        self, args: list[str], ready: re.Pattern[str], ready_timeout_s: float = READY_TIMEOUT_S
    ) -> None:
        self.proc = subprocess.Popen(
            args,
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.stdout_lines: list[str] = []
        self.stderr_lines: list[str] = []
        self._ready = threading.Event()
        self.match: re.Match[str] | None = None
        self._pattern = ready
        self._pumps = [
            threading.Thread(
                target=self._pump, args=(self.proc.stdout, self.stdout_lines), daemon=True
            ),
            threading.Thread(
                target=self._pump, args=(self.proc.stderr, self.stderr_lines), daemon=True
            ),
        ]
        for t in self._pumps:
            t.start()
        if not self._ready.wait(ready_timeout_s):
            self.stop()
            raise RuntimeError(f"{args} did not become ready:\n{self.output()}")
        if self.match is None:
            self.stop()  # reap it and close its pipes: they would warn in a later test
            raise RuntimeError(f"{args} exited before becoming ready:\n{self.output()}")

    def _pump(self, stream: Any, lines: list[str]) -> None:
        for line in stream:
            lines.append(line.rstrip("\n"))
            if self.match is None:
                m = self._pattern.search(line)
                if m:
                    self.match = m
                    self._ready.set()
        self._ready.set()

    def output(self) -> str:
        return "\n".join(self.stdout_lines + self.stderr_lines)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, sig: int) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait(self, timeout_s: float = 15.0) -> int:
        code = self.proc.wait(timeout_s)
        self._close_pipes()
        return code

    def _close_pipes(self) -> None:
        for t in self._pumps:
            t.join(5)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._close_pipes()
        return self.proc.returncode


class Upstream(Process):
    """``tests.support.upstream`` in its own process."""

    def __init__(self, name: str, tls: tuple[str, str] | None = None) -> None:
        self.name = name
        super().__init__(
            [
                sys.executable,
                "-m",
                "tests.support.upstream",
                "--name",
                name,
                "--port",
                "0",
                *(["--tls", *tls] if tls else []),
            ],
            re.compile(r"listening (\S+)"),
        )
        assert self.match is not None
        self.address = self.match.group(1)
        self.url = f"http://{self.address}"


class WsUpstream(Process):
    """``tests.support.ws_upstream`` (a ``websockets`` server) in its own process."""

    def __init__(self) -> None:
        super().__init__(
            [sys.executable, "-m", "tests.support.ws_upstream", "--port", "0"],
            re.compile(r"listening (\S+)"),
        )
        assert self.match is not None
        self.address = self.match.group(1)
        self.url = f"ws://{self.address}"


class H2Upstream(Process):
    """``tests.support.h2_upstream`` (an h2c server on the ``h2`` library, or h2 over TLS with
    ``tls``'s certificate and key files) in its own process (``fired_dir``: a directory shared
    with other such upstreams, so a ``/goaway-*`` key fires once over all of them)."""

    def __init__(
        self,
        name: str,
        refuse_first: int = 0,
        tls: tuple[str, str] | None = None,
        fired_dir: Path | None = None,
        max_streams: int | None = None,
    ) -> None:
        self.name = name
        super().__init__(
            [
                sys.executable,
                "-m",
                "tests.support.h2_upstream",
                "--name",
                name,
                "--refuse-first",
                str(refuse_first),
                *(["--tls", *tls] if tls else []),
                *(["--fired-dir", str(fired_dir)] if fired_dir else []),
                *(["--max-streams", str(max_streams)] if max_streams is not None else []),
            ],
            re.compile(r"listening (\S+)"),
        )
        assert self.match is not None
        self.address = self.match.group(1)


class GrpcUpstream(Process):
    """``tests.support.grpc_upstream`` (a grpcio server: h2c, or h2 over TLS with ``tls``'s
    certificate and key files) in its own process."""

    def __init__(self, name: str, tls: tuple[str, str] | None = None) -> None:
        self.name = name
        super().__init__(
            [
                sys.executable,
                "-m",
                "tests.support.grpc_upstream",
                "--name",
                name,
                *(["--tls", *tls] if tls else []),
            ],
            re.compile(r"listening (\S+)"),
        )
        assert self.match is not None
        self.address = self.match.group(1)


class Gateway(Process):
    """``python -m gateway run --config FILE`` with the config written to ``path``."""

    LINE = re.compile(r"sluice listening data=(\S+) admin=(\S+)(?: tls=(\S+))?")

    def __init__(self, config: dict[str, Any], path: Path) -> None:
        # One data-plane process unless the test sets ``workers`` (the default, one per core,
        # is tested in test_workers.py): a test then sees its requests in one process's
        # traces, balancer and outlier state, as it was written for.
        workers = config.get("workers", 1)
        # With ``workers: N`` the main process starts N more interpreters before it is ready.
        ready_timeout_s = READY_TIMEOUT_S * (3 if workers == "auto" or workers > 1 else 1)
        config = {
            "workers": workers,
            "listen": {"host": "127.0.0.1", "port": 0},
            "admin": {"host": "127.0.0.1", "port": 0},
            **config,
        }
        path.write_text(yaml.safe_dump(config))
        self.config_path = path
        super().__init__(
            [sys.executable, "-m", "gateway", "run", "--config", str(path)],
            self.LINE,
            ready_timeout_s,
        )
        assert self.match is not None
        self.url = self.match.group(1)
        self.admin_url = self.match.group(2)
        self.tls_url: str | None = self.match.group(3)
        """``https://host:port`` of the TLS listener (None without ``tls``)."""
        host, _, port = self.url.removeprefix("http://").rpartition(":")
        self.host = host
        self.port = int(port)

    def rss_bytes(self) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS")


class PeakRss:
    """Samples a process's RSS in a thread; ``peak`` is the largest seen."""

    def __init__(self, gateway: Gateway, interval_s: float = 0.02) -> None:
        self.gateway = gateway
        self.interval_s = interval_s
        self.peak = gateway.rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, self.gateway.rss_bytes())
            except (OSError, RuntimeError):
                return
            time.sleep(self.interval_s)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@contextmanager
def upstreams(*names: str) -> Iterator[list[Upstream]]:
    started: list[Upstream] = []
    try:
        for name in names:
            started.append(Upstream(name))
        yield started
    finally:
        for u in started:
            u.stop()


@contextmanager
def gateway(config: dict[str, Any], path: Path) -> Iterator[Gateway]:
    gw = Gateway(config, path)
    try:
        yield gw
    finally:
        gw.stop()
