"""The ``ScalingPolicy`` custom resource (``sluice.io/v1alpha1``, namespaced), from one model.

:class:`ScalingPolicySpec` is the config file's ``scaling`` model plus ``targetRef``;
:class:`ScalingPolicyStatus` is what the leader writes.  :func:`crd` generates the
CustomResourceDefinition from both (a structural OpenAPI v3 schema the API server enforces:
types, enums, bounds, required keys, unknown keys pruned, and CEL rules for the cross-field
bounds) — ``sluice crd`` prints it and the chart ships it (``charts/sluice/crds/``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from scaler.policy import ScalingPolicy
from scaler.validation import validation_problems

GROUP = "sluice.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "ScalingPolicy"
PLURAL = "scalingpolicies"

_DNS_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
_DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


class TargetRef(BaseModel):
    """What a ScalingPolicy scales: a Service routed by an Ingress, and its workload."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    service: str = Field(
        min_length=1,
        max_length=63,
        pattern=_DNS_LABEL,
        description="The Service (in the policy's namespace) an Ingress routes to.",
    )
    kind: Literal["Deployment", "StatefulSet"] = Field(
        default="Deployment", description="The kind of the workload whose /scale is set."
    )
    name: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=_DNS_SUBDOMAIN,
        description="The workload's name (default: the Service's name).",
    )


class ScalingPolicySpec(ScalingPolicy):
    """``spec``: ``targetRef`` plus every field of a service's ``scaling`` in the config file."""

    target_ref: TargetRef = Field(alias="targetRef", description="What this policy scales.")

    def policy(self) -> ScalingPolicy:
        """The scaling fields alone (what the scaler uses)."""
        return ScalingPolicy.model_validate(
            self.model_dump(exclude={"target_ref"}, exclude_unset=True)
        )


class Condition(BaseModel):
    """A ``metav1.Condition``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["Ready", "Active", "Limited", "ResizeBlocked"] = Field(
        description="Ready: valid and in use; Active: the last decision applied (signals "
        "fresh); Limited: clamped by max_replicas, cpu.max or the budget; ResizeBlocked: "
        "a pod resize was refused or deferred."
    )
    status: Literal["True", "False", "Unknown"] = Field(description="The condition's status.")
    reason: str = Field(
        min_length=1, max_length=1024, description="CamelCase reason for the last transition."
    )
    message: str = Field(default="", max_length=32768, description="Details, for people.")
    lastTransitionTime: str = Field(description="RFC 3339 time the status last changed.")
    observedGeneration: int = Field(
        default=0, ge=0, description="metadata.generation the condition was set for."
    )


class ScalingPolicyStatus(BaseModel):
    """``status`` (written by the leading gateway replica through the status subresource)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    observedGeneration: int = Field(
        default=0, ge=0, description="metadata.generation this status describes."
    )
    service: str = Field(default="", description="The Sluice service (namespace/name).")
    currentReplicas: int | None = Field(
        default=None, ge=0, description="Replicas the workload has now."
    )
    desiredReplicas: int | None = Field(
        default=None, ge=0, description="Replicas the last decision wants."
    )
    cpuPerReplica: str | None = Field(
        default=None, description="CPU each replica is given (a quantity, e.g. 250m)."
    )
    allocatedCores: str | None = Field(
        default=None, description="replicas × CPU: this service's share of the budget (cores)."
    )
    fairShareCores: str | None = Field(
        default=None, description="What the service gets when every service wants all it can."
    )
    budget: str | None = Field(
        default=None, description="The budget in force and where it came from."
    )
    metric: str | None = Field(default=None, description="The metric the decision scaled on.")
    metricValue: str | None = Field(default=None, description="That metric's current value.")
    rule: str | None = Field(default=None, description="The rule that fired last.")
    reasons: list[str] = Field(
        default_factory=list, max_length=32, description="The last decision's reasons."
    )
    conditions: list[Condition] = Field(
        default_factory=list, description="Ready, Active, Limited, ResizeBlocked."
    )


def parse_spec(spec: Mapping[str, Any] | None) -> tuple[ScalingPolicySpec | None, str]:
    """The spec, or (None, why) in the config file's error style (``spec.max_replicas: ...``)."""
    try:
        return ScalingPolicySpec.model_validate(spec or {}), ""
    except ValidationError as e:
        return None, "; ".join(
            f"spec.{path}: {problem}" if path else f"spec: {problem}"
            for path, problem in validation_problems(e)
        )


# ---- the CRD -----------------------------------------------------------------------------------

PRINTER_COLUMNS: tuple[dict[str, Any], ...] = (
    {"name": "Target", "type": "string", "jsonPath": ".spec.targetRef.service"},
    {"name": "Metric", "type": "string", "jsonPath": ".status.metric"},
    {"name": "Value", "type": "string", "jsonPath": ".status.metricValue"},
    {"name": "Replicas", "type": "integer", "jsonPath": ".status.currentReplicas"},
    {"name": "Desired", "type": "integer", "jsonPath": ".status.desiredReplicas"},
    {"name": "CPU", "type": "string", "jsonPath": ".status.cpuPerReplica"},
    {
        "name": "Ready",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
    },
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
)

CROSS_FIELD: tuple[tuple[str, str, str, str], ...] = (
    ("", "min_replicas", "max_replicas", "max_replicas must be >= min_replicas"),
    ("", "panic_window_s", "stable_window_s", "panic_window_s must be <= stable_window_s"),
    ("cpu", "min", "max", "cpu.max must be >= cpu.min"),
)
"""(object path, lower field, upper field, message): ``lower <= upper`` as a CEL rule with the
model's defaults for absent fields; the remaining cross-field rules are checked by Sluice
(an invalid policy gets Ready=False and a Warning event)."""

_DROP = ("title", "default", "examples", "discriminator")
_KEEP = (
    "description",
    "type",
    "format",
    "enum",
    "pattern",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minimum",
    "maximum",
    "required",
    "nullable",
)


def _structural(node: Mapping[str, Any], defs: Mapping[str, Any]) -> dict[str, Any]:
    """A pydantic JSON Schema node as a structural OpenAPI v3 schema for a CRD: ``$ref``
    inlined, ``X | None`` as ``nullable``, ``const`` as ``enum``, numeric exclusive bounds in
    OpenAPI 3.0's boolean form; anything without one type keeps its unknown fields."""
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _structural(merged, defs)
    options = node.get("anyOf") or node.get("oneOf")
    if options:
        concrete = [o for o in options if o.get("type") != "null"]
        extra = {k: v for k, v in node.items() if k in ("description",)}
        if len(concrete) == 1:
            one = _structural({**concrete[0], **extra}, defs)
            if len(concrete) < len(options):
                one["nullable"] = True
            return one
        return {**extra, "x-kubernetes-preserve-unknown-fields": True}
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP:
            continue
        if key == "const":
            out["enum"] = [value]
        elif key == "exclusiveMinimum":
            out["minimum"], out["exclusiveMinimum"] = value, True
        elif key == "exclusiveMaximum":
            out["maximum"], out["exclusiveMaximum"] = value, True
        elif key == "properties":
            out["properties"] = {k: _structural(v, defs) for k, v in value.items()}
        elif key == "items":
            out["items"] = _structural(value, defs)
        elif key == "additionalProperties":
            if isinstance(value, dict):
                out["additionalProperties"] = _structural(value, defs)
        elif key in _KEEP:
            out[key] = value
    if "enum" in out and "type" not in out:
        kinds = {type(v) for v in out["enum"]}
        out["type"] = "string" if kinds == {str} else "integer" if kinds == {int} else "number"
    if "type" not in out:
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def _cel_side(model: type[BaseModel], field: str) -> str:
    default = model.model_fields[field].default
    return f"(has(self.{field}) ? self.{field} : {default!r})"


def _with_rules(schema: dict[str, Any]) -> dict[str, Any]:
    for path, low, high, message in CROSS_FIELD:
        node: dict[str, Any] = schema
        model: type[BaseModel] = ScalingPolicySpec
        for part in filter(None, path.split(".")):
            node = node["properties"][part]
            annotation = model.model_fields[part].annotation
            assert isinstance(annotation, type) and issubclass(annotation, BaseModel)
            model = annotation
        rule = f"{_cel_side(model, low)} <= {_cel_side(model, high)}"
        node.setdefault("x-kubernetes-validations", []).append({"rule": rule, "message": message})
    return schema


def openapi_schema(model: type[BaseModel]) -> dict[str, Any]:
    """``model``'s structural OpenAPI v3 schema."""
    raw = model.model_json_schema(by_alias=True)
    return _structural(raw, raw.get("$defs", {}))


def crd() -> dict[str, Any]:
    """The ScalingPolicy CustomResourceDefinition."""
    spec = _with_rules(openapi_schema(ScalingPolicySpec))
    status = openapi_schema(ScalingPolicyStatus)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": "scalingpolicy",
                "shortNames": ["spol"],
                "categories": ["sluice"],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [dict(c) for c in PRINTER_COLUMNS],
                    "schema": {
                        "openAPIV3Schema": {
                            "description": (
                                "How Sluice scales one Service's workload (the config file's "
                                "scaling fields); status: what it decided and why."
                            ),
                            "type": "object",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec,
                                "status": status,
                            },
                        }
                    },
                }
            ],
        },
    }


def crd_yaml() -> str:
    """The CRD as the YAML file the chart ships."""
    import yaml

    header = "# Generated by `sluice crd` from gateway/platforms/kubernetes/crd.py: do not edit.\n"
    return header + yaml.safe_dump(crd(), sort_keys=False, width=100)
