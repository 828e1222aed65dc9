"""``budget.cpu: auto``: the config, the machine's CPU (cpuset and cgroup quota), the cluster
rule (nodes running managed pods minus others' requests), and the engine taking a new budget."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from gateway.platforms.kubernetes.capacity import cluster_budget, cluster_figures
from gateway.platforms.kubernetes.model import node_from_json, pod_cpu_request, pod_from_json
from gateway.platforms.machine import MachineCpu, auto_budget, cgroup_quota, cpuset_usable
from gateway.settings import Settings, parse_settings, resolve_enforcement
from scaler.engine import Engine
from scaler.policy import BudgetConfig, BudgetCpu, KeyedValueError, ScalingPolicy, within_floors
from scaler.signals import ServiceSignals
from tests.support.kube_objects import node, pod


def test_auto_is_accepted_and_reserved_needs_it() -> None:
    assert BudgetConfig(cpu="auto", reserved=0.5).fixed() is None
    assert BudgetConfig(cpu=3).fixed() == BudgetCpu(3, "budget.cpu")
    with pytest.raises(ValidationError, match="reserved: only used with cpu: auto"):
        BudgetConfig(cpu=3, reserved=1)
    with pytest.raises(ValidationError):
        BudgetConfig.model_validate({"cpu": "all"})
    with pytest.raises(ValidationError):
        BudgetConfig.model_validate({"cpu": 0})
    with pytest.raises(KeyedValueError, match="auto is measured by a platform"):
        BudgetConfig(cpu="auto").fixed_cores()


def test_auto_skips_the_floor_check_at_load() -> None:
    cfg = {
        "platform": "static",
        "budget": {"cpu": "auto"},
        "services": {
            "a": {
                "endpoints": ["127.0.0.1:1"],
                "scaling": {"min_replicas": 64, "max_replicas": 64},
            },
        },
    }
    assert parse_settings(cfg).budget.cpu == "auto"


def _cgroup(root: Path, rel: str, name: str, text: str) -> None:
    d = root / "sys/fs/cgroup" / rel
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_text(text)


def test_cgroup_v2_takes_the_tightest_quota_of_the_cgroup_and_its_ancestors(
    tmp_path: Path,
) -> None:
    _cgroup(tmp_path, "", "cpu.max", "max 100000\n")
    _cgroup(tmp_path, "kubepods", "cpu.max", "150000 100000\n")
    _cgroup(tmp_path, "kubepods/pod1", "cpu.max", "max 100000\n")
    _cgroup(tmp_path, "kubepods/pod1/c", "cpu.max", "300000 100000\n")
    quota = cgroup_quota(tmp_path, "0::/kubepods/pod1/c\n")
    assert quota == (1.5, str(tmp_path / "sys/fs/cgroup/kubepods"))
    assert cgroup_quota(tmp_path, "0::/\n") is None


def test_cgroup_v1_quota_and_no_quota(tmp_path: Path) -> None:
    _cgroup(tmp_path, "cpu,cpuacct/docker/x", "cpu.cfs_quota_us", "50000\n")
    _cgroup(tmp_path, "cpu,cpuacct/docker/x", "cpu.cfs_period_us", "100000\n")
    text = "4:memory:/docker/x\n3:cpu,cpuacct:/docker/x\n0::/\n"
    assert cgroup_quota(tmp_path, text) == (
        0.5,
        str(tmp_path / "sys/fs/cgroup/cpu,cpuacct/docker/x"),
    )
    _cgroup(tmp_path, "cpu,cpuacct/docker/x", "cpu.cfs_quota_us", "-1\n")
    assert cgroup_quota(tmp_path, text) is None


def test_machine_budget_is_cpuset_capped_by_quota_minus_reserved() -> None:
    auto = BudgetConfig(cpu="auto", reserved=0.5)
    b = auto_budget(auto, MachineCpu(4, None))
    assert b.cores == 3.5
    assert b.source == "auto: 4 cores in the cpuset, minus reserved 0.5"
    b = auto_budget(auto, MachineCpu(4, 2.0, "/sys/fs/cgroup/x"))
    assert b.cores == 1.5 and "cgroup quota 2 at /sys/fs/cgroup/x" in b.source
    tiny = auto_budget(BudgetConfig(cpu="auto", reserved=2), MachineCpu(1, None))
    assert tiny.cores == 0.01 and "using 0.01" in tiny.source


def test_pod_cpu_request_counts_sidecars_init_containers_and_overhead() -> None:
    def c(cpu: str, **kw: str) -> dict[str, object]:
        return {"name": "x", "resources": {"requests": {"cpu": cpu}}, **kw}

    assert pod_cpu_request({"containers": [c("100m"), c("200m")]}) == pytest.approx(0.3)
    # a plain init container runs alone: the larger of it and the containers
    assert pod_cpu_request({"initContainers": [c("1")], "containers": [c("250m")]}) == 1
    # a sidecar (restartPolicy Always) runs beside everything after it
    spec = {
        "initContainers": [c("100m", restartPolicy="Always"), c("500m")],
        "containers": [c("200m")],
        "overhead": {"cpu": "50m"},
    }
    assert pod_cpu_request(spec) == pytest.approx(0.6 + 0.05)
    assert pod_cpu_request({"containers": [{"name": "x"}]}) == 0


def _pod(name: str, app: str, cpu: str, node_name: str, ns: str = "shop", phase: str = "Running"):  # type: ignore[no-untyped-def]
    obj = pod(name, app, {"requests": {"cpu": cpu}}, namespace=ns, node=node_name)
    obj["status"]["phase"] = phase
    return pod_from_json(obj)


def test_cluster_rule_nodes_of_managed_pods_minus_others_requests() -> None:
    nodes = [
        node_from_json(node("a", "4")),
        node_from_json(node("b", "8")),
        node_from_json(node("c", "16")),
        node_from_json(node("cp", "2", taints=("NoSchedule",))),
        node_from_json(node("down", "32", ready=False)),
    ]
    pods = [
        _pod("web-1", "web", "500m", "a"),
        _pod("web-2", "web", "500m", "b"),
        _pod("dns", "dns", "250m", "a", ns="kube-system"),
        _pod("batch", "batch", "1", "b", ns="jobs"),
        _pod("done", "batch", "3", "b", ns="jobs", phase="Succeeded"),
        _pod("elsewhere", "x", "2", "c", ns="other"),
    ]
    managed = {"shop/web-1", "shop/web-2"}
    figures = cluster_figures(nodes, pods, managed)
    assert figures.nodes == ("a", "b")
    assert figures.allocatable_cores == 12
    assert figures.others_cores == pytest.approx(1.25) and figures.other_pods == 2
    budget = cluster_budget(figures, reserved=0.75)
    assert budget.cores == pytest.approx(10.0)
    assert budget.source == (
        "auto: 2 node(s), the nodes running managed pods, 12 allocatable minus 1.25 requested "
        "by 2 other pod(s) minus reserved 0.75"
    )
    # nothing managed scheduled yet: every ready schedulable untainted node
    figures = cluster_figures(nodes, pods, set())
    assert figures.nodes == ("a", "b", "c")
    assert figures.others_cores == pytest.approx(0.5 + 0.25 + 0.5 + 1 + 2)
    assert cluster_budget(figures, 0).cores == pytest.approx(28 - 4.25)


def test_cordoned_node_still_counts_while_it_runs_managed_pods() -> None:
    nodes = [node_from_json(node("a", "4", unschedulable=True))]
    pods = [_pod("web-1", "web", "1", "a")]
    assert cluster_figures(nodes, pods, {"shop/web-1"}).nodes == ("a",)
    assert cluster_figures(nodes, pods, set()).nodes == ()


def _policy(**kw: object) -> ScalingPolicy:
    return ScalingPolicy.model_validate({"target": 1, "cpu": {"min": 0.25, "max": 1}, **kw})


def test_a_budget_below_the_floors_is_held_at_them() -> None:
    pols = {"a": _policy(min_replicas=2), "b": _policy(min_replicas=2)}
    held = within_floors(BudgetCpu(0.5, "auto: x"), pols)
    assert held.cores == 1.0
    assert held.source == "auto: x; 0.5 cores is below the services' guaranteed CPU: held at 1"
    assert within_floors(BudgetCpu(3, "auto: y"), pols) == BudgetCpu(3, "auto: y")


def test_engine_takes_a_new_budget_keeping_its_windows_and_names_it() -> None:
    pols = {"api": _policy(max_replicas=20)}
    engine = Engine(pols, BudgetConfig(cpu="auto"), cpu=BudgetCpu(2, "auto: first"))
    load = {"api": ServiceSignals("api", 0.0, in_flight=40)}
    d = engine.tick(0.0, load, {})["api"]
    assert d.allocated_cores == pytest.approx(2)
    assert "of 2 from auto: first" in d.reasons[-1]
    engine.set_cpu(BudgetCpu(5, "auto: second"))
    assert engine.fair_share("api") == pytest.approx(5)  # cap 20 × 1 core > 5
    d = engine.tick(1.0, {"api": ServiceSignals("api", 1.0, in_flight=40)}, {})["api"]
    assert d.allocated_cores == pytest.approx(5)
    assert "of 5 from auto: second" in d.reasons[-1]
    with pytest.raises(KeyedValueError, match="exceeds the budget"):
        engine.set_cpu(BudgetCpu(0.1, "auto: too small"))
    with pytest.raises(ValueError, match=r"budget\.cpu is auto"):
        Engine(pols, BudgetConfig(cpu="auto"))


def test_enforcement_auto_is_share_on_kubernetes_and_follows_the_machine_elsewhere() -> None:
    # Kubernetes: the budget bounds the pods' requests (the kernel's weights); a service whose
    # pods are Guaranteed is held at requests = limits and decided as under limit (its state's
    # cpu_capped, tests/unit/test_engine.py).  Local/static: share only when the budget is
    # every CPU the replicas can run on.
    kube = parse_settings({"platform": "kubernetes", "budget": {"cpu": 4}})
    assert kube.budget.enforcement == "auto"
    assert resolve_enforcement(kube).budget.enforcement == "share"
    limit = parse_settings({"platform": "kubernetes", "budget": {"cpu": 4, "enforcement": "limit"}})
    assert resolve_enforcement(limit).budget.enforcement == "limit"
    static = parse_settings(
        {"budget": {"cpu": 4}, "services": {"api": {"endpoints": ["127.0.0.1:9001"]}}}
    )
    assert resolve_enforcement(static, lambda: 4.0).budget.enforcement == "share"
    assert resolve_enforcement(static, lambda: 8.0).budget.enforcement == "limit"


def test_enforcement_auto_on_local_is_share_on_a_whole_number_of_cpus_it_can_pin() -> None:
    """Below every CPU, weights arbitrate only on CPUs the busy services wait for together:
    on local, a whole number of CPUs the replicas can be pinned to (a cpuset) keeps
    ``share``'s guarantee; a fraction of a CPU, or no cpuset controller, does not."""

    def local(budget: dict[str, object]) -> Settings:
        return parse_settings(
            {
                "platform": "local",
                "budget": budget,
                "services": {
                    "api": {"replicas": {"command": ["true"], "port_range": [20000, 20010]}}
                },
            }
        )

    def rule(budget: dict[str, object], machine: float, pinnable: bool) -> str:
        settings = resolve_enforcement(local(budget), lambda: machine, lambda: pinnable)
        return settings.budget.enforcement

    assert rule({"cpu": 2}, 8.0, True) == "share"
    assert rule({"cpu": 2}, 8.0, False) == "limit"
    assert rule({"cpu": 1.5}, 8.0, True) == "limit"
    assert rule({"cpu": 8}, 8.0, False) == "share"  # every CPU: nothing to pin
    assert rule({"cpu": "auto", "reserved": 2}, 8.0, True) == "share"  # 6 of 8
    assert rule({"cpu": "auto", "reserved": 0.5}, 8.0, True) == "limit"
    assert rule({"cpu": "auto", "reserved": 2}, 8.0, False) == "limit"
    assert rule({"cpu": 2, "enforcement": "limit"}, 8.0, True) == "limit"
    # static runs no replicas: only the whole machine means share there
    static = parse_settings(
        {"budget": {"cpu": 2}, "services": {"api": {"endpoints": ["127.0.0.1:9001"]}}}
    )
    assert resolve_enforcement(static, lambda: 8.0, lambda: True).budget.enforcement == "limit"
    assert BudgetConfig(cpu=3).auto_enforcement(4.0, pinnable=True) == "share"
    assert BudgetConfig(cpu=0.5).auto_enforcement(4.0, pinnable=True) == "limit"


def test_cpuset_usable_reads_the_hierarchy_the_local_platform_uses(tmp_path: Path) -> None:
    unified, cpuset = tmp_path / "unified", tmp_path / "cpuset"
    unified.mkdir()
    cpuset.mkdir()
    info = tmp_path / "mountinfo"

    def mounts(*rows: tuple[Path, str, str]) -> Path:
        lines = [
            f"{30 + i} 22 0:{40 + i} / {point} rw,relatime - {fstype} cgroup {options}"
            for i, (point, fstype, options) in enumerate(rows)
        ]
        info.write_text("\n".join(lines) + "\n")
        return info

    cpu = tmp_path / "cpu"
    cpu.mkdir()
    # this machine's shape: v2 without cpu, v1 cpu and cpuset apart
    (unified / "cgroup.controllers").write_text("\n")
    v1_cpu = (cpu, "cgroup", "rw,cpu,cpuacct")
    assert cpuset_usable(
        mounts((unified, "cgroup2", "rw"), v1_cpu, (cpuset, "cgroup", "rw,cpuset"))
    )
    assert not cpuset_usable(mounts((unified, "cgroup2", "rw"), v1_cpu))
    # no cpu controller anywhere: no local cgroups at all, so nothing to pin with
    assert not cpuset_usable(mounts((unified, "cgroup2", "rw"), (cpuset, "cgroup", "rw,cpuset")))
    # v2 with cpu: its own offer decides, whatever v1 mounts there are
    (unified / "cgroup.controllers").write_text("cpu memory\n")
    assert not cpuset_usable(mounts((unified, "cgroup2", "rw"), (cpuset, "cgroup", "rw,cpuset")))
    (unified / "cgroup.controllers").write_text("cpuset cpu memory\n")
    assert cpuset_usable(mounts((unified, "cgroup2", "rw")))
    assert not cpuset_usable(tmp_path / "missing")


def test_the_pool_pins_share_to_the_budgets_cpus_rounded_up_the_highest_numbered() -> None:
    """What the local pool pins, from the same notion of a whole number of CPUs as the
    ``auto`` rule: within 1e-6 of a whole number is that number."""
    from gateway.platforms.local.pool import LocalPool

    def pinned(cores: float, enforcement: str = "share") -> tuple[int, ...] | None:
        pool = LocalPool(
            {},
            cgroups=None,
            total_cpu_cores=cores,
            enforcement=enforcement,  # type: ignore[arg-type]
            allowed_cpus=lambda: {0, 1, 2, 5},
        )
        return pool.pin_cpus()

    assert pinned(1.0) == (5,)
    assert pinned(2.0000005) == (2, 5)  # whole, as auto counts it: share on 2 CPUs
    assert BudgetConfig(cpu=2.0000005).auto_enforcement(4.0, pinnable=True) == "share"
    assert pinned(1.5) == (2, 5)  # a fraction: auto says limit; written share is pinned too
    assert pinned(0.25) == (5,)
    assert pinned(4.0) is None  # every allowed CPU: nothing to pin
    assert pinned(2.0, "limit") is None
