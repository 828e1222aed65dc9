"""Shared pieces for tests that run real replicas in the local pool under real cgroups."""

from __future__ import annotations

import asyncio
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
