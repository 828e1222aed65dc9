"""Workload files: good ones load (YAML and CSV), bad ones give one `file: key.path: problem` line each."""

from __future__ import annotations

from pathlib import Path

import pytest

from scaler.simulate.workload import WorkloadError, load_workload, parse_workload

ROOT = Path(__file__).resolve().parents[2]


def problems(data: object) -> list[str]:
    with pytest.raises(WorkloadError) as info:
        parse_workload(data, "w.yaml")
    return info.value.problems


def test_the_seed_workload_loads() -> None:
    w = load_workload(ROOT / "benchmarks" / "workloads" / "long_short.yaml")
    assert set(w.services) == {"api", "reports"}
    assert w.services["reports"].bursts[0].every_s == 60


def svc(**over: object) -> dict[str, object]:
    base: dict[str, object] = {"slo_s": 1, "load": [{"at_s": 0, "rps": 1, "cpu_s": 0.1}]}
    base.update(over)
    return {"services": {"api": base}}


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (svc(slo_s=0), "w.yaml: services.api.slo_s: must be > 0, got 0"),
        (svc(load=[]), "w.yaml: services.api.load: must have at least 1 item(s)"),
        (
            svc(load=[{"at_s": 5, "rps": 1, "cpu_s": 0.1}]),
            "w.yaml: services.api.load[0].at_s: the first step must start at 0, got 5",
        ),
        (
            svc(load=[{"at_s": 0, "rps": 1, "cpu_s": 0.1}, {"at_s": 0, "rps": 2, "cpu_s": 0.1}]),
            "w.yaml: services.api.load[1].at_s: must be > the previous step's at_s (0), got 0",
        ),
        (
            svc(load=[{"at_s": 0, "rps": -1, "cpu_s": 0.1}]),
            "w.yaml: services.api.load[0].rps: must be >= 0, got -1",
        ),
        (
            svc(bursts=[{"every_s": 10, "for_s": 20, "rps": 5, "cpu_s": 0.1}]),
            "w.yaml: services.api.bursts[0].for_s: must be <= every_s (10), got 20",
        ),
        (
            svc(
                repeat_s=0.5,
                load=[{"at_s": 0, "rps": 1, "cpu_s": 1}, {"at_s": 1, "rps": 1, "cpu_s": 1}],
            ),
            "w.yaml: services.api.repeat_s: must be > the last step's at_s (1), got 0.5",
        ),
        (svc(rsp=3), "w.yaml: services.api.rsp: unknown key"),
        (
            {"services": {"API": svc()["services"]["api"]}},
            "w.yaml: services.API: a service name must be",
        ),
        ({"services": {}}, "w.yaml: services: must have at least 1 item(s)"),
        ([], "w.yaml: the top level must be a mapping, got list"),
    ],
)
def test_bad_workload_names_key_path_and_problem(data: object, expected: str) -> None:
    assert any(p.startswith(expected) for p in problems(data)), problems(data)


def test_csv_workload(tmp_path: Path) -> None:
    path = tmp_path / "w.csv"
    path.write_text(
        "service,at_s,rps,cpu_s,slo_s,startup_s\n"
        "api,0,10,0.1,1,3\n"
        "api,60,20,0.1,1,3\n"
        "reports,0,0,0.05,0.5,\n"
    )
    w = load_workload(path)
    assert [s.rps for s in w.services["api"].load] == [10, 20]
    assert w.services["api"].startup_s == 3
    assert w.services["reports"].slo_s == 0.5


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("service,at_s,rps\napi,0,1\n", "w.csv: line 1: missing column(s) cpu_s, slo_s"),
        ("service,at_s,rps,cpu_s,slo_s,x\n", "w.csv: line 1: unknown column(s) x"),
        (
            "service,at_s,rps,cpu_s,slo_s\napi,0,ten,0.1,1\n",
            "w.csv: line 2: rps: must be a number, got 'ten'",
        ),
        (
            "service,at_s,rps,cpu_s,slo_s\napi,0,1,0.1,1\napi,5,1,0.1,2\n",
            "w.csv: line 3: slo_s: must be the same on every row of service 'api' (1), got 2",
        ),
        (
            "service,at_s,rps,cpu_s,slo_s\napi,0,1,0,1\n",
            "w.csv: services.api.load[0].cpu_s: must be > 0, got 0.0",
        ),
    ],
)
def test_bad_csv(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "w.csv"
    path.write_text(text)
    with pytest.raises(WorkloadError) as info:
        load_workload(path)
    assert any(
        p.replace(str(tmp_path) + "/", "").startswith(expected) for p in info.value.problems
    ), info.value.problems


def test_unreadable_yaml_reports_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "w.yaml"
    path.write_text("services:\n  api: [1,\n")
    with pytest.raises(WorkloadError) as info:
        load_workload(path)
    assert info.value.problems[0].startswith(f"{path}:3:1: invalid YAML")


def test_pieces_repeat_and_bursts() -> None:
    w = parse_workload(
        {
            "services": {
                "a": {
                    "slo_s": 1,
                    "load": [
                        {"at_s": 0, "rps": 1, "cpu_s": 0.1},
                        {"at_s": 10, "rps": 2, "cpu_s": 0.2},
                    ],
                    "repeat_s": 30,
                    "bursts": [{"every_s": 25, "for_s": 5, "start_s": 20, "rps": 9, "cpu_s": 0.3}],
                }
            }
        }
    )
    pieces = [(p.start_s, p.end_s, p.rps) for p in w.services["a"].pieces(50)]
    assert pieces == [(0, 10, 1), (10, 30, 2), (30, 40, 1), (40, 50, 2), (20, 25, 9), (45, 50, 9)]
