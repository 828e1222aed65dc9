"""cgroup file logic against temp directories laid out like cgroup v2 and v1 hierarchies."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from gateway.platforms.local.cgroup_parent import (
    CgroupParent,
    open_parent,
    parent_name_for,
    sweep_stale,
)
from gateway.platforms.local.cgroups import (
    DEFAULT_WEIGHT_CORES,
    CgroupLayout,
    CgroupUnavailable,
    ReplicaCgroup,
    cores_for_weight,
    detect_layout,
    quota_us_for,
    weight_for,
)


def mountinfo(*mounts: tuple[Path, str, str]) -> str:
    """Lines shaped like /proc/self/mountinfo: (mount point, fstype, super options)."""
    lines = ["22 1 0:21 / / rw,relatime - overlay overlay rw"]
    for i, (point, fstype, options) in enumerate(mounts):
        lines.append(
            f"{30 + i} 22 0:{40 + i} / {point} rw,relatime shared:{i} - {fstype} cgroup {options}"
        )
    return "\n".join(lines) + "\n"


@pytest.fixture
def v2(tmp_path: Path) -> CgroupLayout:
    root = tmp_path / "unified"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "cgroup.subtree_control").write_text("")
    return detect_layout(mountinfo((root, "cgroup2", "rw,nsdelegate")))


@pytest.fixture
def v1(tmp_path: Path) -> CgroupLayout:
    cpu, acct = tmp_path / "cpu", tmp_path / "cpuacct"
    cpu.mkdir()
    acct.mkdir()
    unified = tmp_path / "unified"
    unified.mkdir()
    (unified / "cgroup.controllers").write_text("\n")
    return detect_layout(
        mountinfo(
            (unified, "cgroup2", "rw"),
            (cpu, "cgroup", "rw,cpu"),
            (acct, "cgroup", "rw,cpuacct"),
            (tmp_path / "memory", "cgroup", "rw,memory"),
        )
    )


def test_detect_prefers_v2_with_the_cpu_controller(v2: CgroupLayout, tmp_path: Path) -> None:
    unified = tmp_path / "unified"
    assert v2 == CgroupLayout(version=2, cpu_root=unified, memory_root=unified, cpuset_root=unified)


def test_detect_falls_back_to_v1_when_v2_lacks_cpu(v1: CgroupLayout, tmp_path: Path) -> None:
    # This machine's shape: cgroup2 without cpu, v1 cpu and cpuacct mounted apart.
    assert v1 == CgroupLayout(
        version=1,
        cpu_root=tmp_path / "cpu",
        cpuacct_root=tmp_path / "cpuacct",
        memory_root=tmp_path / "memory",
    )


def test_detect_v1_with_cpu_and_cpuacct_mounted_together(tmp_path: Path) -> None:
    point = tmp_path / "cpu,cpuacct"
    layout = detect_layout(mountinfo((point, "cgroup", "rw,cpu,cpuacct")))
    assert layout == CgroupLayout(version=1, cpu_root=point, cpuacct_root=None)


def test_detect_reports_why_nothing_is_usable(tmp_path: Path) -> None:
    unified = tmp_path / "unified"
    unified.mkdir()
    (unified / "cgroup.controllers").write_text("memory pids\n")
    with pytest.raises(CgroupUnavailable) as info:
        detect_layout(
            mountinfo((unified, "cgroup2", "rw"), (tmp_path / "m", "cgroup", "rw,memory"))
        )
    assert "has no cpu controller" in str(info.value)
    assert "no cgroup v1 hierarchy with the cpu controller" in str(info.value)


def test_quota_and_weight_conversions() -> None:
    assert quota_us_for(0.5) == 50_000
    assert quota_us_for(2.0) == 200_000
    assert quota_us_for(0.001) == 1_000  # the kernel's minimum
    with pytest.raises(ValueError, match="cores must be > 0"):
        quota_us_for(0)
    assert weight_for(1.0, 2) == 100
    assert weight_for(0.25, 2) == 25
    assert weight_for(500.0, 2) == 10_000
    assert weight_for(0.001, 2) == 1
    assert weight_for(1.0, 1) == 1024
    assert weight_for(0.001, 1) == 2


def test_v2_parent_enables_cpu_and_child_limits_are_written_in_place(v2: CgroupLayout) -> None:
    parent = CgroupParent(v2, "sluice-test", rmdir=shutil.rmtree)
    parent.create()
    assert (v2.cpu_root / "cgroup.subtree_control").read_text() == "+cpu +memory"
    assert (parent.cpu_dir / "cgroup.subtree_control").read_text() == "+cpu"
    cg = parent.child("api-0")
    assert cg.procs_files == (v2.cpu_root / "sluice-test" / "api-0" / "cgroup.procs",)

    cg.set_cpu(0.5)
    assert (cg.cpu_dir / "cpu.max").read_text() == "50000 100000"
    assert (cg.cpu_dir / "cpu.weight").read_text() == "50"
    assert cg.read_limit().cores == 0.5
    assert cg.read_limit().weight == 50

    cg.set_cpu(1.5)
    assert (cg.cpu_dir / "cpu.max").read_text() == "150000 100000"
    assert cg.read_limit().cores == 1.5

    cg.set_cpu(None)
    assert (cg.cpu_dir / "cpu.max").read_text() == "max 100000"
    assert cg.read_limit().quota_us is None
    assert cg.read_limit().cores is None


def test_v2_share_writes_a_weight_and_the_cap_as_quota(v2: CgroupLayout) -> None:
    parent = CgroupParent(v2, "sluice-test", rmdir=shutil.rmtree)
    parent.create()
    cg = parent.child("api-0")
    cg.set_share(0.5, 1.0)  # guaranteed 0.5 core, capped at cpu.max = 1 core
    assert (cg.cpu_dir / "cpu.weight").read_text() == "50"
    assert (cg.cpu_dir / "cpu.max").read_text() == "100000 100000"
    assert cg.read_limit().cores == 1.0
    assert cores_for_weight(cg.read_limit().weight, 2) == 0.5

    cg.set_share(1.25, None)  # no cap of its own: only the parent's (the budget)
    assert (cg.cpu_dir / "cpu.weight").read_text() == "125"
    assert (cg.cpu_dir / "cpu.max").read_text() == "max 100000"

    # Limit enforcement on the same cgroup: quota and weight both follow the decided CPU.
    cg.set_cpu(0.5)
    assert (cg.cpu_dir / "cpu.weight").read_text() == "50"
    assert (cg.cpu_dir / "cpu.max").read_text() == "50000 100000"
    with pytest.raises(ValueError, match="weight cores must be > 0"):
        cg.set_share(0.0, 1.0)


def test_v1_share_writes_shares_and_the_cap_as_quota(v1: CgroupLayout) -> None:
    parent = CgroupParent(v1, "sluice-test", rmdir=shutil.rmtree)
    parent.create()
    cg = parent.child("api-0")
    cg.set_share(0.25, 1.5)
    assert (cg.cpu_dir / "cpu.cfs_period_us").read_text() == "100000"
    assert (cg.cpu_dir / "cpu.cfs_quota_us").read_text() == "150000"
    assert (cg.cpu_dir / "cpu.shares").read_text() == "256"
    assert cg.read_limit().cores == 1.5
    assert cores_for_weight(cg.read_limit().weight, 1) == 0.25

    cg.set_share(2.0, None)
    assert (cg.cpu_dir / "cpu.cfs_quota_us").read_text() == "-1"
    assert (cg.cpu_dir / "cpu.shares").read_text() == "2048"
    assert cg.read_limit().cores is None

    cg.set_cpu(0.25)
    assert (cg.cpu_dir / "cpu.cfs_quota_us").read_text() == "25000"
    assert (cg.cpu_dir / "cpu.shares").read_text() == "256"


def test_cores_for_weight_inverts_weight_for() -> None:
    for cores in (0.05, 0.25, 1.0, 3.5):
        assert cores_for_weight(weight_for(cores, 1), 1) == pytest.approx(cores, abs=1 / 1024)
        assert cores_for_weight(weight_for(cores, 2), 2) == pytest.approx(cores, abs=1 / 100)


def test_v2_usage_and_throttling_from_cpu_stat(v2: CgroupLayout) -> None:
    cg = ReplicaCgroup(v2, v2.cpu_root, None)
    (v2.cpu_root / "cpu.stat").write_text(
        "usage_usec 2500000\nuser_usec 2000000\nsystem_usec 500000\n"
        "nr_periods 40\nnr_throttled 7\nthrottled_usec 350000\n"
    )
    usage = cg.read_usage()
    assert usage.usage_s == 2.5
    assert usage.throttled_s == 0.35
    assert (usage.periods, usage.throttled_periods) == (40, 7)


def test_v2_usage_without_the_cpu_controller_has_no_throttling(v2: CgroupLayout) -> None:
    cg = ReplicaCgroup(v2, v2.cpu_root, None)
    (v2.cpu_root / "cpu.stat").write_text("usage_usec 10\nuser_usec 6\nsystem_usec 4\n")
    usage = cg.read_usage()
    assert usage.usage_s == 10e-6
    assert usage.throttled_s == 0.0


def test_v1_limits_usage_and_both_hierarchies(v1: CgroupLayout) -> None:
    assert v1.cpuacct_root is not None
    parent = CgroupParent(v1, "sluice-test", rmdir=shutil.rmtree)
    parent.create()
    cg = parent.child("api-0")
    assert cg.procs_files == (
        v1.cpu_root / "sluice-test" / "api-0" / "cgroup.procs",
        v1.cpuacct_root / "sluice-test" / "api-0" / "cgroup.procs",
    )
    cg.set_cpu(0.25)
    assert (cg.cpu_dir / "cpu.cfs_period_us").read_text() == "100000"
    assert (cg.cpu_dir / "cpu.cfs_quota_us").read_text() == "25000"
    assert (cg.cpu_dir / "cpu.shares").read_text() == "256"
    assert cg.read_limit().cores == 0.25

    cg.set_cpu(None)
    assert (cg.cpu_dir / "cpu.cfs_quota_us").read_text() == "-1"
    assert cg.read_limit().cores is None

    (cg.cpu_dir / "cpu.stat").write_text(
        "nr_periods 12\nnr_throttled 5\nthrottled_time 750000000\nnr_bursts 0\nburst_time 0\n"
    )
    assert cg.acct_dir is not None
    (cg.acct_dir / "cpuacct.usage").write_text("1250000000\n")
    usage = cg.read_usage()
    assert usage.usage_s == 1.25
    assert usage.throttled_s == 0.75
    assert (usage.periods, usage.throttled_periods) == (12, 5)


def test_v1_period_written_only_when_it_differs(v1: CgroupLayout) -> None:
    cg = CgroupParent(v1, "p", rmdir=shutil.rmtree)
    cg.create()
    child = cg.child("a")
    (child.cpu_dir / "cpu.cfs_period_us").write_text("100000\n")  # the kernel's own format
    child.set_cpu(1.0)
    assert (child.cpu_dir / "cpu.cfs_period_us").read_text() == "100000\n"
    assert (child.cpu_dir / "cpu.cfs_quota_us").read_text() == "100000"


def test_v1_usage_is_none_without_cpuacct(tmp_path: Path) -> None:
    layout = detect_layout(mountinfo((tmp_path, "cgroup", "rw,cpu")))
    cg = ReplicaCgroup(layout, tmp_path, None)
    (tmp_path / "cpu.stat").write_text("nr_periods 1\nnr_throttled 0\nthrottled_time 0\n")
    assert cg.read_usage().usage_s is None


def test_destroy_removes_children_and_parent_in_every_hierarchy(v1: CgroupLayout) -> None:
    assert v1.cpuacct_root is not None
    parent = CgroupParent(v1, "sluice-test", rmdir=shutil.rmtree)
    parent.create()
    parent.child("a-0")
    parent.child("a-1")
    assert parent.destroy()
    assert not (v1.cpu_root / "sluice-test").exists()
    assert not (v1.cpuacct_root / "sluice-test").exists()


def test_names_must_be_one_path_element(v2: CgroupLayout) -> None:
    with pytest.raises(ValueError, match="one path element"):
        CgroupParent(v2, "../escape")
    parent = CgroupParent(v2, "ok", rmdir=shutil.rmtree)
    parent.create()
    with pytest.raises(ValueError, match="one path element"):
        parent.child("a/b")


def test_sweep_removes_only_parents_of_dead_sluice_processes(v1: CgroupLayout) -> None:
    assert v1.cpuacct_root is not None
    names = (
        "sluice-7-111",
        "sluice-7-222",
        "sluice-8-111",
        "sluice-111",
        "sluice-test-abc",
        "other",
    )
    for name in names:
        CgroupParent(v1, name).create()
    swept = sweep_stale(v1, pid_alive=lambda pid: pid == 222, rmdir=shutil.rmtree, pid_namespace=7)
    assert swept == ["sluice-7-111"]
    left = sorted(p.name for p in v1.cpu_root.iterdir())
    # Alive, another pid namespace's (whose pids we cannot see), or not Sluice's naming: kept.
    assert left == ["other", "sluice-111", "sluice-7-222", "sluice-8-111", "sluice-test-abc"]
    assert not (v1.cpuacct_root / "sluice-7-111").exists()


def test_parent_names_carry_the_pid_namespace() -> None:
    assert parent_name_for(1234, pid_namespace=4026531836) == "sluice-4026531836-1234"
    assert parent_name_for(1234).startswith("sluice-")


def test_open_parent_reports_unwritable_hierarchy(tmp_path: Path) -> None:
    missing = tmp_path / "not-mounted"
    info = tmp_path / "mountinfo"
    info.write_text(mountinfo((missing, "cgroup", "rw,cpu,cpuacct")))
    with pytest.raises(CgroupUnavailable, match="cannot create cgroup"):
        open_parent("sluice-test", mountinfo_path=info, sweep=False)


def test_open_parent_creates_the_parent(
    v2: CgroupLayout, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(mountinfo((v2.cpu_root, "cgroup2", "rw")))
    with caplog.at_level(logging.WARNING):
        parent = open_parent("sluice-test", mountinfo_path=info)
    assert parent.cpu_dir == v2.cpu_root / "sluice-test"
    assert parent.cpu_dir.is_dir()


def test_v2_service_cgroups_hold_their_replicas_with_the_controllers_enabled(
    v2: CgroupLayout,
) -> None:
    (v2.cpu_root / "cgroup.controllers").write_text("cpu memory\n")
    parent = CgroupParent(v2, "sluice-test", rmdir=shutil.rmtree)
    parent.create()
    (parent.cpu_dir / "cgroup.controllers").write_text("cpu memory\n")
    api = parent.service("api")
    assert api.cpu_dir == parent.cpu_dir / "api"
    # v2: the service's cgroup enables cpu (and memory) for its replicas, holds no process.
    assert (api.cpu_dir / "cgroup.subtree_control").read_text() == "+cpu"
    api.set_share(0.75, None)  # its entitlement as weight, no quota of its own
    assert (api.cpu_dir / "cpu.weight").read_text() == "75"
    assert (api.cpu_dir / "cpu.max").read_text() == "max 100000"
    cg = parent.child("api-0", "api")
    assert cg.cpu_dir == parent.cpu_dir / "api" / "api-0"
    assert cg.mem_dir == cg.cpu_dir
    assert cg.procs_files == (parent.cpu_dir / "api" / "api-0" / "cgroup.procs",)
    cg.set_share(DEFAULT_WEIGHT_CORES, 1.0)
    assert (cg.cpu_dir / "cpu.weight").read_text() == "100"  # the kernel's default
    assert (cg.cpu_dir / "cpu.max").read_text() == "100000 100000"
    assert parent.service("api") is api  # made once
    assert parent.child("api-0", "api") is cg
    assert parent.children() == [cg]  # replicas only
    assert parent.destroy()
    assert not parent.cpu_dir.exists()


def test_v1_service_cgroups_exist_in_every_hierarchy_and_usage_is_read_from_cpuacct(
    v1: CgroupLayout,
) -> None:
    assert v1.cpuacct_root is not None and v1.memory_root is not None
    v1.memory_root.mkdir()
    parent = CgroupParent(v1, "sluice-test", rmdir=shutil.rmtree)
    parent.create()
    api = parent.service("api")
    cg = parent.child("api-0", "api")
    flat = parent.child("web-0")  # limit enforcement's layout, beside it
    for root in (v1.cpu_root, v1.cpuacct_root, v1.memory_root):
        assert (root / "sluice-test" / "api" / "api-0").is_dir()
        assert (root / "sluice-test" / "web-0").is_dir()
    assert cg.procs_files == tuple(
        root / "sluice-test" / "api" / "api-0" / "cgroup.procs"
        for root in (v1.cpu_root, v1.cpuacct_root, v1.memory_root)
    )
    assert (api.acct_dir, api.mem_dir) == (
        v1.cpuacct_root / "sluice-test" / "api",
        v1.memory_root / "sluice-test" / "api",
    )
    api.set_share(0.25, None)
    assert (api.cpu_dir / "cpu.shares").read_text() == "256"
    assert (api.cpu_dir / "cpu.cfs_quota_us").read_text() == "-1"
    assert api.acct_dir is not None
    (api.acct_dir / "cpuacct.usage").write_text("3000000000\n")
    assert api.read_usage().usage_s == 3.0  # every replica's, past and present
    # A replica leaves: its directories go, the service's stay.
    assert parent.discard(cg)
    assert parent.children() == [flat]
    assert not (v1.cpuacct_root / "sluice-test" / "api" / "api-0").exists()
    assert (v1.cpuacct_root / "sluice-test" / "api").is_dir()
    assert parent.destroy()
    for root in (v1.cpu_root, v1.cpuacct_root, v1.memory_root):
        assert not (root / "sluice-test").exists()


def test_a_service_named_like_a_control_file_gets_its_own_directory(v1: CgroupLayout) -> None:
    parent = CgroupParent(v1, "sluice-test", rmdir=shutil.rmtree)
    parent.create()
    (parent.cpu_dir / "tasks").write_text("")  # as the kernel has it in every v1 cgroup
    tasks = parent.service("tasks")
    assert tasks.cpu_dir == parent.cpu_dir / "tasks.service"
    assert tasks.acct_dir is not None and tasks.acct_dir.name == "tasks.service"
    assert parent.child("tasks-0", "tasks").cpu_dir == tasks.cpu_dir / "tasks-0"


def test_sweep_removes_a_dead_parent_with_service_cgroups_in_every_hierarchy(
    v1: CgroupLayout,
) -> None:
    assert v1.cpuacct_root is not None and v1.memory_root is not None
    v1.memory_root.mkdir()
    dead = CgroupParent(v1, "sluice-7-111")
    dead.create()
    dead.child("api-0", "api")
    dead.child("api-1", "api")
    dead.child("web-0")
    swept = sweep_stale(v1, pid_alive=lambda pid: False, rmdir=shutil.rmtree, pid_namespace=7)
    assert swept == ["sluice-7-111"]
    for root in (v1.cpu_root, v1.cpuacct_root, v1.memory_root):
        assert not (root / "sluice-7-111").exists()


def pinned_v1(tmp_path: Path) -> CgroupLayout:
    """This machine's shape with the cpuset hierarchy mounted (its root's CPUs and memory)."""
    cpu, cpuset = tmp_path / "cpu", tmp_path / "cpuset"
    cpu.mkdir()
    cpuset.mkdir()
    (cpuset / "cpuset.cpus").write_text("0-3\n")
    (cpuset / "cpuset.mems").write_text("0\n")
    return detect_layout(
        mountinfo((cpu, "cgroup", "rw,cpu,cpuacct"), (cpuset, "cgroup", "rw,cpuset"))
    )


def test_detect_finds_the_v1_cpuset_hierarchy(tmp_path: Path) -> None:
    layout = pinned_v1(tmp_path)
    assert layout.cpuset_root == tmp_path / "cpuset"
    assert layout.cpu_root == tmp_path / "cpu"


def test_v1_pin_makes_a_cpuset_every_replica_joins_and_destroy_removes_it(
    tmp_path: Path,
) -> None:
    layout = pinned_v1(tmp_path)
    parent = CgroupParent(layout, "sluice-7-111", rmdir=shutil.rmtree)
    parent.create()
    before = parent.child("api-0", "api")
    (before.cpu_dir / "cgroup.procs").write_text("4242\n")  # a replica already running
    parent.pin([3, 2])
    pinned = tmp_path / "cpuset" / "sluice-7-111"
    assert (pinned / "cgroup.procs").read_text() == "4242"  # moved into the cpuset
    for procs in (before.cpu_dir / "cgroup.procs", pinned / "cgroup.procs"):
        procs.write_text("")  # a made-up pid: not one for destroy() to signal
    assert (pinned / "cpuset.cpus").read_text() == "2,3"
    assert (pinned / "cpuset.mems").read_text() == "0"  # a v1 cpuset needs memory nodes first
    assert parent.pinned == (2, 3) and parent.cpuset_dir == pinned
    after = parent.child("web-0")
    for cg in (before, after):
        assert cg.join_files == (*cg.procs_files, pinned / "cgroup.procs")
        # the shared cpuset is not the replica's: its pids and its removal stay its own
        assert pinned / "cgroup.procs" not in cg.procs_files
        assert pinned not in cg.dirs
    parent.pin(None)  # every CPU of the hierarchy's root again
    assert (pinned / "cpuset.cpus").read_text() == "0-3"
    assert parent.pinned is None
    assert parent.destroy()
    assert not pinned.exists()


def test_v2_pin_enables_cpuset_and_writes_the_parents_cpus(v2: CgroupLayout) -> None:
    parent = CgroupParent(v2, "sluice-7-111")
    parent.create()
    replica = parent.child("api-0", "api")
    parent.pin([1])
    assert "+cpuset" in (v2.cpu_root / "cgroup.subtree_control").read_text()
    assert (parent.cpu_dir / "cpuset.cpus").read_text() == "1"
    assert replica.join_files == replica.procs_files  # the subtree obeys its parent's cpuset
    parent.pin(None)
    assert (parent.cpu_dir / "cpuset.cpus").read_text() == ""


def test_pin_without_the_cpuset_controller_says_so(v1: CgroupLayout) -> None:
    parent = CgroupParent(v1, "sluice-7-111")
    parent.create()
    with pytest.raises(CgroupUnavailable, match="no cpuset cgroup controller"):
        parent.pin([1])
    assert parent.pinned is None


def test_sweep_removes_a_dead_parents_cpuset(tmp_path: Path) -> None:
    layout = pinned_v1(tmp_path)
    dead = CgroupParent(layout, "sluice-7-111")
    dead.create()
    dead.pin([1])
    alive = CgroupParent(layout, "sluice-7-222")
    alive.create()
    alive.pin([2])
    orphan = tmp_path / "cpuset" / "sluice-7-333"  # its cpu parent already gone
    orphan.mkdir()
    swept = sweep_stale(
        layout, pid_alive=lambda pid: pid == 222, rmdir=shutil.rmtree, pid_namespace=7
    )
    assert swept == ["sluice-7-111", "sluice-7-333"]
    assert sorted(p.name for p in (tmp_path / "cpuset").iterdir() if p.is_dir()) == ["sluice-7-222"]
