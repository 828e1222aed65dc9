"""Hot reload of the config file: on change (polled), on SIGHUP, on ``POST /api/reload``.

A reload reads and validates the whole file first; only a valid config is handed to
``apply`` (the runtime swaps routes, services and limits in one synchronous step, so no
request ever sees half of it).  An invalid one is rejected: its problems are logged (one
``file: key.path: problem`` line each) and returned to the caller, and the running config
keeps serving.  Keys that need a restart (``listen`` but its ``h2c``, ``admin``, ``platform``, and
``telemetry``, whose tracer provider is built once at start) are rejected the same way when they
differ.

The watcher polls the file every ``reload.interval_s``: a changed (mtime, size, inode)
triggers a read, and only changed *content* triggers a reload, so ``touch`` does nothing
and a half-written file is simply rejected until the writer finishes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from gateway.settings import ConfigError, Settings, load_settings

log = logging.getLogger(__name__)

RESTART_ONLY_KEYS = ("listen", "admin", "platform", "telemetry")
"""Top-level keys a running gateway cannot change (their sockets or platform are live)."""


@dataclass(frozen=True)
class ReloadResult:
    ok: bool
    generation: int
    """How many configs have been applied since start (1 = the initial one)."""
    problems: list[str] = field(default_factory=list)
    changed: bool = True
    """False when the file's content equals what is running (nothing was done)."""

    def as_json(self) -> dict[str, object]:
        out: dict[str, object] = {"ok": self.ok, "generation": self.generation}
        if self.problems:
            out["errors"] = self.problems
        if self.ok:
            out["changed"] = self.changed
        return out


def restart_only_changes(old: Settings, new: Settings, source: str) -> list[str]:
    """One problem line per restart-only key that differs."""
    problems = []
    for key in RESTART_ONLY_KEYS:
        before, after = getattr(old, key), getattr(new, key)
        if key == "listen":  # listen.h2c is applied live (the socket stays)
            before, after = (
                before.model_copy(update={"h2c": False}),
                after.model_copy(update={"h2c": False}),
            )
        if before != after:
            problems.append(
                f"{source}: {key}: cannot change while running (restart Sluice to apply it)"
            )
    return problems


class ReloadCounts(Protocol):
    """What ``/metrics`` reports of reloads (a :class:`Reloader` is one)."""

    @property
    def generation(self) -> int: ...
    @property
    def succeeded_total(self) -> int: ...
    @property
    def rejected_total(self) -> int: ...
    @property
    def last_ok(self) -> bool: ...
    @property
    def last_success_unix_s(self) -> float: ...


class Reloader:
    """Validates and applies new versions of one config file."""

    def __init__(
        self,
        path: Path,
        current: Settings,
        apply: Callable[[Settings], None],
        load: Callable[[Path], Settings] = load_settings,
        wall_clock: Callable[[], float] = time.time,
        *,
        refresh: Callable[[Settings], None] | None = None,
    ) -> None:
        self.path = path
        self.current = current
        self._apply = apply
        self._load = load
        self._wall_clock = wall_clock
        self._refresh = refresh
        """Called when the file is unchanged: re-reads the files it names (TLS certificates);
        raises ConfigError to report a problem."""
        self.generation = 1
        self.rejected_total = 0
        self.succeeded_total = 0
        """Reloads that applied a change or found the file unchanged."""
        self.last_ok = True
        self.last_success_unix_s = wall_clock()
        """Unix time of the last successful reload (the start until one succeeds)."""
        self._digest = self._read_digest()
        self._stat = self._stat_key()
        self._task: asyncio.Task[None] | None = None

    def _stat_key(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def _read_digest(self) -> bytes | None:
        try:
            return hashlib.sha256(self.path.read_bytes()).digest()
        except OSError:
            return None

    def reload(self, trigger: str = "request") -> ReloadResult:
        """Load, validate and apply the file now; never raises for a bad config."""
        digest = self._read_digest()
        try:
            new = self._load(self.path)
        except ConfigError as e:
            return self._reject(trigger, e.problems)
        problems = restart_only_changes(self.current, new, str(self.path))
        if problems:
            return self._reject(trigger, problems)
        if new == self.current:
            if self._refresh is not None:
                try:
                    self._refresh(new)
                except ConfigError as e:
                    return self._reject(trigger, e.problems)
            self._succeeded()
            self._digest = digest
            log.info("config reload (%s): %s unchanged", trigger, self.path)
            return ReloadResult(True, self.generation, changed=False)
        try:
            self._apply(new)
        except ConfigError as e:  # the runtime found a problem only it can see
            return self._reject(trigger, e.problems)
        self.current = new
        self._digest = digest
        self.generation += 1
        self._succeeded()
        log.info(
            "config reload (%s): applied %s (generation %d)", trigger, self.path, self.generation
        )
        return ReloadResult(True, self.generation)

    def _succeeded(self) -> None:
        self.succeeded_total += 1
        self.last_ok = True
        self.last_success_unix_s = self._wall_clock()

    def _reject(self, trigger: str, problems: list[str]) -> ReloadResult:
        self.rejected_total += 1
        self.last_ok = False
        log.error(
            "config reload (%s) rejected, the running config keeps serving:\n  %s",
            trigger,
            "\n  ".join(problems),
        )
        return ReloadResult(False, self.generation, problems)

    def poll(self) -> ReloadResult | None:
        """Reload if the file's content changed since the last look; None if it did not."""
        stat = self._stat_key()
        if stat == self._stat:
            return None
        self._stat = stat
        digest = self._read_digest()
        if digest is None or digest == self._digest:
            return None
        self._digest = digest  # a rejected version is not retried until it changes again
        return self.reload("file changed")

    # -- the async edges --------------------------------------------------------------------

    def start(self, interval_s: float, watch: bool = True) -> None:
        """Install the SIGHUP handler and (if ``watch``) start polling the file."""
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGHUP, self.reload, "SIGHUP")
        if watch and self._task is None:
            self._task = loop.create_task(self._watch(interval_s), name="config-watch")

    async def stop(self) -> None:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _watch(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                self.poll()
            except Exception:  # a supervised loop: log and keep watching
                log.exception("config watch failed; still watching %s", self.path)
