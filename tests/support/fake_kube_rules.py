"""The API server's rules the fake enforces: errors as Status objects, patch types, QoS,
what a Pod update and a resize may change, and field validation (pure functions)."""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from typing import Any

Obj = dict[str, Any]
_MICROTIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)$")
_CPU = re.compile(r"^(\d+(\.\d+)?)(m|u|n)?$")


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message

    def status(self) -> Obj:
        return {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }


def cpu_millis(q: Any) -> float:
    m = _CPU.match(str(q))
    if not m:
        raise ApiError(422, "Invalid", f"quantities must match the regular expression: got {q!r}")
    scale = {"m": 1.0, "u": 1e-3, "n": 1e-6, None: 1000.0}[m.group(3)]
    return float(m.group(1)) * scale


def qos_class(pod: Obj) -> str:
    """Guaranteed / Burstable / BestEffort, as the API computes it (cpu and memory)."""
    containers = pod.get("spec", {}).get("containers", [])
    any_set = False
    guaranteed = True
    for c in containers:
        res = c.get("resources") or {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        if req or lim:
            any_set = True
        for r in ("cpu", "memory"):
            limit = lim.get(r)
            request = req.get(r, limit)
            if limit is None or request is None:
                guaranteed = False
            elif r == "cpu":
                # Quantities, not strings: "1" and "1000m" are equal.
                guaranteed = guaranteed and cpu_millis(str(request)) == cpu_millis(str(limit))
            elif str(request) != str(limit):
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"


def merge_patch(target: Any, patch: Any, strategic: bool = False) -> Any:
    """RFC 7386 merge patch; with ``strategic``, lists of objects with ``name`` merge by name."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif (
            strategic
            and isinstance(value, list)
            and isinstance(out.get(key), list)
            and all(isinstance(v, dict) and "name" in v for v in value)
        ):
            merged = [copy.deepcopy(v) for v in out[key]]
            for item in value:
                for i, existing in enumerate(merged):
                    if isinstance(existing, dict) and existing.get("name") == item["name"]:
                        merged[i] = merge_patch(existing, item, strategic)
                        break
                else:
                    merged.append(copy.deepcopy(item))
            out[key] = merged
        else:
            out[key] = merge_patch(out.get(key), value, strategic)
    return out


def json_patch(target: Any, ops: Any) -> Any:
    if not isinstance(ops, list):
        raise ApiError(400, "BadRequest", "json patch must be a list of operations")
    doc = copy.deepcopy(target)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent[p]
        last = parts[-1]
        if op["op"] == "add" and isinstance(parent, list):
            parent.insert(int(last), op["value"])
        elif op["op"] in ("add", "replace"):
            parent[int(last) if isinstance(parent, list) else last] = op["value"]
        elif op["op"] == "remove":
            del parent[int(last) if isinstance(parent, list) else last]
        else:
            raise ApiError(422, "Invalid", f"unsupported json patch op {op['op']!r}")
    return doc


def labels_match(obj: Obj, selector: str | None) -> bool:
    if not selector:
        return True
    labels = obj.get("metadata", {}).get("labels") or {}
    for term in selector.split(","):
        if "!=" in term:
            k, v = term.split("!=", 1)
            if labels.get(k) == v:
                return False
        elif "=" in term:
            k, v = term.replace("==", "=").split("=", 1)
            if labels.get(k) != v:
                return False
        elif term.startswith("!"):
            if term[1:] in labels:
                return False
        elif term not in labels:
            return False
    return True


def _containers(pod: Obj) -> Iterator[Obj]:
    yield from pod.get("spec", {}).get("containers", [])


def check_pod_update(old: Obj, new: Obj) -> None:
    before = {c["name"]: c.get("resources") for c in _containers(old)}
    after = {c["name"]: c.get("resources") for c in _containers(new)}
    if before != after:
        raise ApiError(
            422,
            "Invalid",
            f'Pod "{old["metadata"]["name"]}" is invalid: spec: Forbidden: pod updates may not '
            "change fields other than `spec.containers[*].image`, ... (container resources may "
            "only be changed through the resize subresource)",
        )


def check_resize(old: Obj, new: Obj) -> None:
    def strip(pod: Obj) -> Obj:
        spec = copy.deepcopy(pod.get("spec", {}))
        for c in spec.get("containers", []):
            c.pop("resources", None)
            c.pop("resizePolicy", None)
        return spec

    name = old["metadata"]["name"]
    if strip(old) != strip(new):
        raise ApiError(
            422,
            "Invalid",
            f'Pod "{name}" is invalid: spec: Forbidden: only cpu and memory resources are mutable',
        )
    for c in _containers(new):
        res = c.get("resources") or {}
        for part in ("requests", "limits"):
            if "cpu" in (res.get(part) or {}):
                cpu_millis(res[part]["cpu"])
        req = (res.get("requests") or {}).get("cpu")
        lim = (res.get("limits") or {}).get("cpu")
        if req is not None and lim is not None and cpu_millis(req) > cpu_millis(lim):
            raise ApiError(
                422,
                "Invalid",
                f'Pod "{name}" is invalid: spec.containers[{c["name"]}].resources.requests: '
                "Invalid value: must be less than or equal to cpu limit",
            )
    for c_old in _containers(old):
        res_old = c_old.get("resources") or {}
        c_new = next((c for c in _containers(new) if c["name"] == c_old["name"]), {})
        res_new = c_new.get("resources") or {}
        for part in ("requests", "limits"):
            if "cpu" in (res_old.get(part) or {}) and "cpu" not in (res_new.get(part) or {}):
                raise ApiError(
                    422,
                    "Invalid",
                    f'Pod "{name}" is invalid: spec.containers[{c_old["name"]}].resources.{part}'
                    "[cpu]: Forbidden: resource cpu cannot be removed",
                )
    if qos_class(old) != qos_class(new):
        # ValidatePodResize: the stored QoS class against the one computed from the new spec
        # (field.Invalid on "spec"), e.g. a Guaranteed pod resized to requests < limits.
        raise ApiError(
            422,
            "Invalid",
            f'Pod "{name}" is invalid: spec: Invalid value: "{qos_class(new)}": '
            "Pod QOS Class may not change as a result of resizing",
        )


def validate(plural: str, obj: Obj) -> None:
    if plural == "leases":
        spec = obj.get("spec") or {}
        for field in ("acquireTime", "renewTime"):
            value = spec.get(field)
            if value is not None and not _MICROTIME.match(str(value)):
                raise ApiError(
                    400,
                    "BadRequest",
                    f"Lease in version v1 cannot be handled: spec.{field}: {value!r} is not "
                    "RFC3339 with microseconds (MicroTime)",
                )
    if plural in ("deployments", "statefulsets"):
        replicas = obj.get("spec", {}).get("replicas", 1)
        if not isinstance(replicas, int) or replicas < 0:
            raise ApiError(422, "Invalid", f"spec.replicas: Invalid value: {replicas!r}")
