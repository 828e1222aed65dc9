"""``GET /api/decisions``: the scaler's recent decisions, made visible.

* :func:`decision_json` — one :class:`~scaler.decision.Decision` as JSON (replicas, CPU per
  replica, budget share, the rule that fired, the reasons, inputs and the explanation as
  data: steps, clamps, flows; with ``scaling.metrics``, ``metrics``: each metric's answer
  and the winner), never with NaN or infinity;
* :func:`decisions_route` — ``GET /api/decisions[?service=NAME][&limit=N]``: the scaler
  loop's recent decisions (an unknown or malformed parameter -> 400; a bounded ring of those that changed something), newest first,
  plus the latest decision of every service and the budget, with what the platform reports
  (on the local platform: what is lent between ticks and the quota in force).
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from scaler.decision import Decision
from scaler.metrics import metrics_of

if TYPE_CHECKING:
    from gateway.runtime import Runtime

DEFAULT_LIMIT = 50
QUERY_PARAMETERS = frozenset({"limit", "service"})
_DIGITS = re.compile(r"[0-9]{1,9}")  # ASCII only: str.isdigit() takes "²", which int() refuses


def decision_json(d: Decision) -> dict[str, Any]:
    """One decision as JSON: the figures, ``reasons`` (text, for people) and ``explanation``
    (the same as data: rule, inputs, steps, clamps, flows).  No NaN or infinity: JSON has
    none, so a non-finite number is ``null``."""
    explanation = d.explanation.as_json()
    out: dict[str, Any] = finite_json(
        {
            "service": d.service,
            "at": d.at,
            "replicas": d.replicas,
            "cpu_per_replica_cores": d.cpu_per_replica_cores,
            "allocated_cores": d.allocated_cores,
            "rule": d.rule,
            "frozen": d.frozen,
            "wake_concurrency": d.wake_concurrency,
            "reasons": list(d.reasons),
            "inputs": explanation["inputs"],
            "explanation": explanation,
        }
    )
    metrics = metrics_of(d.explanation)
    if metrics is not None:
        out["metrics"] = finite_json(metrics)
    return out


def finite_json(value: Any) -> Any:
    """``value`` with every float that is not finite replaced by ``None`` (recursively)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


def decisions_route(runtime: Runtime) -> Route:
    """``GET /api/decisions``: 404 when this gateway runs no scaler loop."""

    async def decisions(request: Request) -> Response:
        loop = runtime.scaler
        if loop is None:
            return JSONResponse({"error": "no scaler runs in this gateway"}, status_code=404)
        params = request.query_params
        unknown = sorted(set(params) - QUERY_PARAMETERS)
        if unknown:
            return JSONResponse(
                {"error": f"{unknown[0]}: unknown parameter (allowed: limit, service)"},
                status_code=400,
            )
        service = params.get("service")
        raw_limit = params.get("limit", str(DEFAULT_LIMIT))
        if not _DIGITS.fullmatch(raw_limit) or int(raw_limit) < 1:
            return JSONResponse(
                {"error": f"limit must be a whole number >= 1, got {raw_limit[:40]!r}"},
                status_code=400,
            )
        if service is not None and service not in runtime.services:
            return JSONResponse({"error": f"no service named {service!r}"}, status_code=404)
        recent = [d for d in reversed(loop.recent) if service is None or d.service == service][
            : int(raw_limit)
        ]
        latest = {
            name: decision_json(d)
            for name, d in sorted(loop.last.items())
            if service is None or name == service
        }
        budget = runtime.settings.budget
        platform = runtime.platform
        lending: dict[str, Any] = (
            dict(platform.report()) if platform is not None else {"lending": False}
        )
        # kubernetes: each Ingress host's certificate; the metrics.k8s.io poller
        own = {k: lending.pop(k) for k in ("tls", "pod_metrics") if k in lending}
        return JSONResponse(
            finite_json(
                {
                    "at": runtime.now(),
                    "platform": runtime.settings.platform,
                    "applied": runtime.settings.platform != "static",
                    "ticks": loop.ticks,
                    "early_ticks": loop.early_ticks,
                    "wakes": dict(sorted(loop.wakes.items())),
                    "budget": {
                        "cpu": runtime.budget_cores(),
                        "cpu_config": budget.cpu,
                        "source": (
                            runtime.budget.source
                            if runtime.budget is not None
                            else "not measured yet"
                        ),
                        "arbitration": budget.arbitration,
                        "enforcement": budget.enforcement,
                        "allocated_cores": sum(d.allocated_cores for d in loop.last.values()),
                        **lending,
                    },
                    "latest": latest,
                    "recent": [decision_json(d) for d in recent],
                    **own,
                }
            )
        )

    return Route("/api/decisions", decisions)
