"""``sluice_cpu_quota_in_force_cores``: the quota per replica in force, when a platform has one."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from gateway.admin.metrics import DecisionCollector, build_registry, render
from scaler.decision import Decision


def samples(collector: DecisionCollector) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = render(build_registry(dict, lambda: 0.0, collector)).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


def decision(service: str) -> Decision:
    return Decision(
        service=service,
        at=1.0,
        replicas=1,
        cpu_per_replica_cores=1.0,
        allocated_cores=1.0,
        rule="stable",
    )


def test_quota_in_force_per_service_when_reported() -> None:
    got = samples(
        DecisionCollector(
            lambda: {"api": decision("api"), "reports": decision("reports")},
            lambda: 2.0,
            lambda: True,
            lambda: {"api": 1.9, "reports": 0.1},
        )
    )
    assert got[("sluice_cpu_quota_in_force_cores", (("service", "api"),))] == 1.9
    assert got[("sluice_cpu_quota_in_force_cores", (("service", "reports"),))] == 0.1
    assert got[("sluice_cpu_per_replica_cores", (("service", "api"),))] == 1.0


def test_absent_without_quotas() -> None:
    got = samples(DecisionCollector(lambda: {"api": decision("api")}, lambda: 2.0, lambda: False))
    assert not any(name == "sluice_cpu_quota_in_force_cores" for name, _ in got)
