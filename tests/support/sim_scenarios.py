"""A short two-service scenario for simulator tests: a steady ``api`` and a bursty ``reports``;
and hand-made services and arrivals for the event-driven models."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from scaler.policy import ScalingPolicy
from scaler.simulate.arrivals import Arrivals
from scaler.simulate.model import READY, Node, ServiceModel

BURSTY: dict[str, Any] = {
    "duration_s": 180,
    "seed": 3,
    "services": {
        "api": {"slo_s": 1, "cpu_cv": 0.5, "load": [{"at_s": 0, "rps": 16, "cpu_s": 0.1}]},
        "reports": {
            "slo_s": 0.5,
            "cpu_cv": 1,
            "startup_s": 2,
            "load": [{"at_s": 0, "rps": 0, "cpu_s": 0.05}],
            "bursts": [{"every_s": 60, "for_s": 10, "start_s": 30, "rps": 20, "cpu_s": 0.05}],
        },
    },
}
"""The workload (``parse_workload(BURSTY)``): 180 s, a 10 s burst of ``reports`` every 60 s."""

POLICIES = {
    "api": ScalingPolicy(target=2, max_replicas=4, cpu={"min": 0.25, "max": 1.0, "request": 0.5}),
    "reports": ScalingPolicy(
        target=2, max_replicas=4, cpu={"min": 0.25, "max": 1.0, "request": 0.25}
    ),
}
"""The two services' policies: 1..4 replicas of 0.25..1 core, as the seed scenario."""


def service(
    name: str,
    arrivals: Arrivals,
    *,
    cores_max: float = 1.0,
    request_cores_max: float = 1.0,
) -> ServiceModel:
    return ServiceModel(
        name, arrivals, startup_s=0.0, request_cores_max=request_cores_max, cores_max=cores_max
    )


def requests(*pairs: tuple[float, float]) -> Arrivals:
    """(arrival time, CPU-seconds) pairs."""
    return Arrivals(
        np.array([t for t, _ in pairs], dtype=np.float64),
        np.array([w for _, w in pairs], dtype=np.float64),
    )


def placed(capacity: float, targets: Mapping[ServiceModel, tuple[int, float]]) -> Node:
    """Put each model's (replicas, cores per replica) on a node of ``capacity``, all serving."""
    node = Node(capacity, {m.name: m for m in targets})
    claims = node.claims()
    for m, (replicas, cores) in targets.items():
        m.set_target(replicas, cores, claims)
    node.schedule(0.0)
    for m in targets:
        for r in m.replicas:
            r.phase = READY
    return node
