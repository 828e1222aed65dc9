"""The API server's rules the fake enforces: errors as Status objects, patch types, QoS,
what a Pod update and a resize may change, and field validation (pure functions)."""

from __future__ import annotations

import copy
import ipaddress
import re
from collections.abc import Iterator
from typing import Any

Obj = dict[str, Any]
_MICROTIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}(Z|[+-]\d\d:\d\d)$")
_CPU = re.compile(r"^(\d+(\.\d+)?)(m|u|n)?$")


class ApiError(Exception):
    def __init__(
        self, code: int, reason: str, message: str, causes: list[Obj] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.causes = causes

    def status(self) -> Obj:
        out: Obj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.causes:
            out["details"] = {"causes": self.causes}
        return out


def check_resize_admission(
    old: Obj, new: Obj, node_cpu_millis: float | None, others_on_node_millis: float
) -> None:
    """What pods/resize admission refuses before the kubelet sees the resize (v1.36):

    * a running container whose status reports no resources: the node's kubelet does not
      support in-place resize (422);
    * the pod's new CPU requests do not fit the node's allocatable with the other pods'
      requests (403 Forbidden, cause ``NodeCapacity``)."""
    name = old["metadata"]["name"]
    status = old.get("status") or {}
    if status.get("phase") == "Running" and any(
        cs.get("resources") is None for cs in status.get("containerStatuses") or []
    ):
        raise ApiError(
            422,
            "Invalid",
            f'Pod "{name}" is invalid: spec: Forbidden: Pod running on node without support '
            "for resize",
        )
    if node_cpu_millis is None:
        return
    wanted = sum(
        cpu_millis(((c.get("resources") or {}).get("requests") or {}).get("cpu", "0"))
        for c in _containers(new)
    )
    if wanted + others_on_node_millis > node_cpu_millis:
        node = (old.get("spec") or {}).get("nodeName")
        raise ApiError(
            403,
            "Forbidden",
            f'pods "{name}" is forbidden: Pod resize rejected: node {node} didn\'t have enough '
            f"allocatable resources: cpu, requested: {wanted:g}m, used: "
            f"{others_on_node_millis:g}m, capacity: {node_cpu_millis:g}m",
            [{"reason": "NodeCapacity", "message": "Node didn't have enough capacity: cpu"}],
        )


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
        # (field.Invalid on "spec"), e.g. a Guaranteed pod resized to requests < limits; the
        # message quotes the pod's *old* class (seen on a real kube-apiserver v1.36).
        raise ApiError(
            422,
            "Invalid",
            f'Pod "{name}" is invalid: spec: Invalid value: "{qos_class(old)}": '
            "Pod QOS Class may not change as a result of resizing",
        )


def _bad_slice_address(address: str, address_type: str) -> str | None:
    """Why an EndpointSlice address is refused (ValidateEndpointIP): loopback, link-local,
    unspecified and multicast IPs may not be endpoints; FQDN addresses must be DNS names."""
    if address_type == "FQDN":
        ok = re.fullmatch(
            r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", address
        )
        return None if ok and len(address) <= 253 else "must be a valid DNS subdomain"
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return "must be a valid IP address"
    if (ip.version == 4) != (address_type == "IPv4"):
        return f"must be an {address_type} address"
    if ip.is_unspecified:
        return "may not be unspecified (0.0.0.0)"
    if ip.is_loopback:
        return "may not be in the loopback range (127.0.0.0/8, ::1/128)"
    if ip.is_link_local:
        return "may not be in the link-local range (169.254.0.0/16, fe80::/10)"
    if ip.is_multicast:
        return "may not be in the multicast range"
    return None


def validate(plural: str, obj: Obj) -> None:
    if plural == "endpointslices":
        address_type = obj.get("addressType") or ""
        if address_type not in ("IPv4", "IPv6", "FQDN"):
            raise ApiError(422, "Invalid", f"addressType: Unsupported value: {address_type!r}")
        for i, e in enumerate(obj.get("endpoints") or []):
            for j, a in enumerate(e.get("addresses") or []):
                why = _bad_slice_address(str(a), address_type)
                if why:
                    raise ApiError(
                        422,
                        "Invalid",
                        f'EndpointSlice.discovery.k8s.io "{obj["metadata"]["name"]}" is '
                        f'invalid: endpoints[{i}].addresses[{j}]: Invalid value: "{a}": {why}',
                    )
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
