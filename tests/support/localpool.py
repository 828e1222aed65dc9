"""Shared pieces for tests that run real replicas in the local pool under real cgroups."""

from __future__ import annotations

import asyncio
import os
import random
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.platforms.local.cgroup_parent import open_parent
from gateway.platforms.local.cgroups import CgroupUnavailable
from gateway.platforms.local.config import ReplicasConfig
from gateway.platforms.local.identity import default_identity, preflight
from gateway.platforms.local.pool import LocalPool
from tests.support.procs import MARKER_VAR, pids_with_marker

ROOT = Path(__file__).resolve().parents[2]
DEMO = ["{python}", "-m", "gateway.tools.demo", "--port", "{port}"]


def _cgroups_unusable() -> str | None:
    try:
        parent = open_parent(f"sluice-probe-{uuid.uuid4().hex[:8]}", sweep=False)
    except CgroupUnavailable as e:
        return str(e)
    parent.destroy()
    return None


_UNUSABLE = _cgroups_unusable()
needs_cgroups = pytest.mark.skipif(_UNUSABLE is not None, reason=f"no CPU cgroups: {_UNUSABLE}")


def _replica_user() -> str | None:
    """``root`` when the suite runs as root and ``nobody`` cannot run the suite's own
    interpreter (e.g. pyenv under a 0700 /root): Sluice then starts no replica unless
    ``replicas.user: root`` is written, so the tests that are not about isolation write it
    (tests/integration/test_local_isolation.py covers the drop itself); else None."""
    if os.geteuid() != 0:
        return None
    who = default_identity()
    if who is not None and preflight(DEMO, os.environ.get("PATH"), who) is None:
        return None
    return "root"


REPLICA_USER = _replica_user()
REPLICA_USER_FIELDS: dict[str, str] = {} if REPLICA_USER is None else {"user": REPLICA_USER}
"""``replicas:`` fields for configs of tests that run ``{python}`` replicas (see above)."""


async def until(predicate: Callable[[], bool], timeout_s: float = 30.0) -> bool:
    """Bounded polling on the event loop (a wait, not a timed assertion)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.02)
    return predicate()


class Harness:
    """Unique cgroup parent, process marker and port ranges for one test; checks cleanup."""

    def __init__(self) -> None:
        self.marker = uuid.uuid4().hex
        self.parent_name = f"sluice-test-{self.marker[:12]}"
        self.pools: list[LocalPool] = []
        base = random.randrange(20000, 60000, 100)
        self._next_range = iter(range(base, base + 100, 25))

    def spec(self, command: list[str] | None = None, **over: Any) -> ReplicasConfig:
        start = next(self._next_range)
        fields: dict[str, Any] = {
            "command": command or DEMO,
            "port_range": (start, start + 24),
            "env": {MARKER_VAR: self.marker, "PYTHONPATH": str(ROOT)},
            "grace_s": 5.0,
            "restart_backoff_s": 0.05,
            "restart_backoff_max_s": 0.5,
            **REPLICA_USER_FIELDS,
        }
        fields.update(over)
        return ReplicasConfig(**fields)

    def pool(self, specs: dict[str, ReplicasConfig], **kw: Any) -> LocalPool:
        kw.setdefault("cgroup_parent_name", self.parent_name)
        pool = LocalPool(specs, **kw)
        self.pools.append(pool)
        return pool


async def run_harness() -> AsyncIterator[Harness]:
    """Body of a fixture: yields a Harness, then closes its pools and checks nothing is left."""
    h = Harness()
    try:
        yield h
    finally:
        for pool in h.pools:
            await pool.close(drain=False)
    for pool in h.pools:
        if pool.cgroups is not None:
            assert not pool.cgroups.cpu_dir.exists(), f"{pool.cgroups.cpu_dir} left behind"
    leftovers = pids_with_marker(h.marker)
    assert leftovers == [], f"processes left behind: {leftovers}"


async def get(address: str, path: str, timeout_s: float = 60.0) -> httpx.Response:
    async with httpx.AsyncClient(timeout=timeout_s) as client:
        return await client.get(f"http://{address}{path}")
