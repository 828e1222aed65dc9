"""Runs a LocalPool of demo replicas and prints READY; the test then SIGKILLs this process.

usage: pool_runner.py <port_start> <port_end> <marker> <replicas> <limit|share> [grandchild]
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from gateway.platforms.local.config import ReplicasConfig  # noqa: E402
from gateway.platforms.local.pool import Enforcement, LocalPool  # noqa: E402
from tests.support.localpool import REPLICA_USER_FIELDS  # noqa: E402


async def main(
    start: int, end: int, marker: str, replicas: int, enforcement: Enforcement, grandchild: bool
) -> None:
    demo = "{python} -m gateway.tools.demo --port {port}"
    command = ["sh", "-c", f"sleep 300 & exec {demo}"] if grandchild else demo.split()
    spec = ReplicasConfig(
        command=command,
        port_range=(start, end),
        env={"SLUICE_TEST_MARKER": marker, "PYTHONPATH": str(ROOT)},
        **REPLICA_USER_FIELDS,
    )
    pool = LocalPool({"api": spec}, enforcement=enforcement)
    await pool.start()
    pool.scale("api", replicas, 0.5)
    while pool.status("api").ready < replicas:
        await asyncio.sleep(0.02)
    parent = pool.cgroups.name if pool.cgroups else "-"
    print("READY", parent, *(r.pid for r in pool.status("api").replicas), flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    a = sys.argv[1:]
    mode: Enforcement = "share" if a[4] == "share" else "limit"
    asyncio.run(main(int(a[0]), int(a[1]), a[2], int(a[3]), mode, a[5:] == ["grandchild"]))
