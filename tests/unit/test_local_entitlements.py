"""Share enforcement's entitlements on the local platform: computed as the engine's fair
shares, handed to the pool (and kept in step with the budget in force), written as the
weights of the services' cgroups (temp directories laid out like cgroup v1 and v2)."""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.platforms.local.actuator import LocalActuator, entitlements
from gateway.platforms.local.cgroup_parent import CgroupParent
from gateway.platforms.local.cgroups import DEFAULT_WEIGHT_CORES, CgroupLayout, weight_for
from gateway.platforms.local.config import ReplicasConfig
from gateway.platforms.local.platform import LocalPlatform
from gateway.platforms.local.pool import Enforcement, LocalPool
from gateway.settings import Settings, parse_settings
from scaler.engine import Engine
from scaler.policy import BudgetConfig, BudgetCpu, ScalingPolicy
from scaler.signals import ServiceSignals


def policy(weight: float = 1.0, **kw: Any) -> ScalingPolicy:
    data: dict[str, Any] = {"min_replicas": 1, "max_replicas": 2, "cpu": {"min": 0.1, "max": 1.0}}
    data.update(kw)
    return ScalingPolicy.model_validate({**data, "weight": weight})


def spec(workdir: Path, port: int) -> ReplicasConfig:
    return ReplicasConfig(
        command=["{python}", "-c", "pass"],
        port_range=(port, port + 1),
        workdir=str(workdir),
        user="root",
    )


@pytest.fixture
def v1(tmp_path: Path) -> CgroupLayout:
    """This machine's shape: cpu, cpuacct and memory mounted apart."""
    roots = [tmp_path / "cpu", tmp_path / "cpuacct", tmp_path / "memory"]
    for root in roots:
        root.mkdir()
    return CgroupLayout(version=1, cpu_root=roots[0], cpuacct_root=roots[1], memory_root=roots[2])


@given(
    budget=st.floats(0.5, 16.0),
    weights=st.lists(st.floats(0.1, 10.0), min_size=1, max_size=5),
    max_replicas=st.integers(1, 6),
)
@settings(max_examples=60, deadline=None)
def test_entitlements_are_the_engines_fair_shares(
    budget: float, weights: list[float], max_replicas: int
) -> None:
    policies = {f"s{i}": policy(w, max_replicas=max_replicas) for i, w in enumerate(weights)}
    if sum(p.floor_cores for p in policies.values()) > budget:
        return
    engine = Engine(policies, BudgetConfig(cpu=budget))
    got = entitlements(budget, policies)
    assert got == {name: pytest.approx(engine.fair_share(name)) for name in policies}
    assert sum(got.values()) <= budget + 1e-9


def test_entitlements_keep_floors_and_weights() -> None:
    policies = {
        "api": policy(3.0),
        "batch": policy(1.0, guaranteed_cpu=0.5),
        "tiny": policy(1.0, max_replicas=1, cpu={"min": 0.05, "max": 0.1}),
    }
    got = entitlements(1.5, policies)
    assert got["tiny"] == pytest.approx(0.1)  # all it can use
    assert got["batch"] == pytest.approx(0.5)  # its floor, above its weight's part
    assert got["api"] == pytest.approx(0.9)  # the rest
    assert entitlements(1.0, {}) == {}


def test_the_actuator_hands_the_pool_fair_shares_of_its_budget(tmp_path: Path) -> None:
    pool = LocalPool(
        {"a": spec(tmp_path, 40100), "b": spec(tmp_path, 40200)},
        total_cpu_cores=1.0,
        enforcement="share",
    )
    LocalActuator(pool, {"a": policy(3.0), "b": policy(1.0), "ghost": policy(4.0)})
    # Fair shares over every policy the engine decides for (ghost included), set for the
    # services the pool runs.
    shares = entitlements(1.0, {"a": policy(3.0), "b": policy(1.0), "ghost": policy(4.0)})
    assert pool.status("a").entitlement_cores == pytest.approx(shares["a"])
    assert pool.status("b").entitlement_cores == pytest.approx(shares["b"])
    unbounded = LocalPool({"a": spec(tmp_path, 40300)}, enforcement="share")
    LocalActuator(unbounded, {"a": policy()})
    assert unbounded.status("a").entitlement_cores is None  # no budget: the default weight


def test_bad_entitlements_are_refused_whole(tmp_path: Path) -> None:
    pool = LocalPool({"a": spec(tmp_path, 40400)}, total_cpu_cores=1.0, enforcement="share")
    with pytest.raises(KeyError, match="runs no service 'nope'"):
        pool.set_entitlements({"a": 0.5, "nope": 0.5})
    for bad in (-0.1, math.nan):
        with pytest.raises(ValueError, match="a: entitlement must be >= 0 cores"):
            pool.set_entitlements({"a": bad})
    assert pool.status("a").entitlement_cores is None


@pytest.mark.parametrize("enforcement", ["share", "limit"])
async def test_service_cgroups_are_weighted_by_entitlement_in_share_mode_only(
    v1: CgroupLayout, tmp_path: Path, enforcement: Enforcement
) -> None:
    parent = CgroupParent(v1, "sluice-test", rmdir=shutil.rmtree)
    parent.create()
    pool = LocalPool(
        {"a": spec(tmp_path, 40500), "b": spec(tmp_path, 40600)},
        cgroups=parent,
        total_cpu_cores=1.0,
        enforcement=enforcement,
    )
    pool.set_entitlements({"a": 0.75})  # b: never set
    async with pool:
        a, b = pool.service_cgroup("a"), pool.service_cgroup("b")
        if enforcement == "limit":
            # Flat: replicas right below the parent; the entitlement is only recorded.
            assert a is None and b is None
            assert not (parent.cpu_dir / "a").exists()
            assert pool.status("a").entitlement_cores == 0.75
            return
        assert a is not None and b is not None
        assert (a.cpu_dir, b.cpu_dir) == (parent.cpu_dir / "a", parent.cpu_dir / "b")
        assert (a.cpu_dir / "cpu.shares").read_text() == str(weight_for(0.75, 1))
        assert (b.cpu_dir / "cpu.shares").read_text() == str(weight_for(DEFAULT_WEIGHT_CORES, 1))
        assert (a.cpu_dir / "cpu.cfs_quota_us").read_text() == "-1"
        assert v1.cpuacct_root is not None
        assert a.acct_dir == v1.cpuacct_root / "sluice-test" / "a"  # usage is read there
        # Updated in place; the decided CPU writes no weight.
        pool.set_entitlements({"a": 0.25, "b": 0.75})
        pool.set_cpu("a", 0.9)
        assert (a.cpu_dir / "cpu.shares").read_text() == str(weight_for(0.25, 1))
        assert (b.cpu_dir / "cpu.shares").read_text() == str(weight_for(0.75, 1))
        status = pool.status("a")
        assert (status.entitlement_cores, status.cpu_per_replica_cores) == (0.25, 0.9)
        assert status.cpu_applied


class FakeGateway:
    """What LocalPlatform uses of the gateway before it starts: no services, no signals."""

    def __init__(self) -> None:
        self.services: dict[str, Any] = {}

    def signals(self, now: float | None = None) -> dict[str, ServiceSignals]:
        return {}

    async def wait_drained(
        self, service: str, address: str, timeout_s: float | None = None
    ) -> bool:
        return True


class RemeasuredPlatform(LocalPlatform):
    """The budget in force changes as ``budget.cpu: auto`` re-measured would make it."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings, FakeGateway())
        self.cpu = super().budget_cpu()

    def budget_cpu(self) -> BudgetCpu:
        return self.cpu


def test_the_platform_keeps_the_pool_on_the_budget_and_entitlements_in_force(
    tmp_path: Path,
) -> None:
    services = {
        name: {
            "replicas": {
                "command": ["{python}", "-c", "pass"],
                "port_range": [port, port + 3],
                "workdir": str(tmp_path),
            },
            "scaling": {
                "min_replicas": 0,
                "max_replicas": 4,
                "cpu": {"min": 0.25, "max": 1.0},
                "weight": weight,
            },
        }
        for name, port, weight in (("api", 40700, 1.0), ("reports", 40800, 3.0))
    }
    settings = parse_settings(
        {"platform": "local", "budget": {"cpu": 2, "enforcement": "share"}, "services": services}
    )
    platform = RemeasuredPlatform(settings)
    pool = platform.pool
    assert pool.status("api").entitlement_cores == pytest.approx(0.5)  # until the first tick
    assert pool.status("reports").entitlement_cores == pytest.approx(1.5)
    platform.signals()  # a tick: nothing changed
    assert pool.total_cpu_cores == 2
    platform.cpu = BudgetCpu(1.0, "re-measured")
    platform.signals()  # the next tick sees the new budget
    assert pool.total_cpu_cores == 1.0
    assert pool.status("api").entitlement_cores == pytest.approx(0.25)
    assert pool.status("reports").entitlement_cores == pytest.approx(0.75)
    engine = Engine(platform.policies(), settings.budget, cpu=platform.cpu)
    assert pool.status("reports").entitlement_cores == pytest.approx(engine.fair_share("reports"))
