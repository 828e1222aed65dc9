"""CustomResourceDefinitions for the fake API server, with the API server's semantics where
Sluice depends on them:

* a CRD is accepted only with a structural schema (every field has a ``type``, or
  ``x-kubernetes-preserve-unknown-fields``; no ``type``/``description``/``default`` inside
  ``anyOf``/``oneOf``/``allOf``/``not``), else 422;
* a custom resource is validated against ``openAPIV3Schema``: types (a ``number`` field's
  integers are doubles), ``enum``, ``pattern``, lengths, bounds (OpenAPI 3.0 boolean
  ``exclusiveMinimum``), ``required``, ``nullable``, and ``x-kubernetes-validations`` CEL rules
  (evaluated with cel-python); every failure is one ``Invalid`` cause, all in one 422;
* unknown fields are pruned (``metadata`` is not), as the API server does without
  ``fieldValidation=Strict``;
* ``additionalPrinterColumns`` render a ``meta.k8s.io/v1`` Table (what ``kubectl get`` asks for
  with ``Accept: application/json;as=Table;g=meta.k8s.io;v=v1``), JSONPath as kubectl's subset.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import celpy

from tests.support.fake_kube_rules import ApiError, Obj

_JUNCTORS = ("anyOf", "oneOf", "allOf", "not")
_NOT_IN_JUNCTORS = ("type", "description", "default", "additionalProperties", "nullable")


@dataclass(frozen=True)
class CustomResource:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    schema: Obj
    columns: tuple[Obj, ...]
    status_subresource: bool


def _structural_problems(node: Any, path: str, in_junctor: bool = False) -> list[str]:
    if not isinstance(node, dict):
        return [f"{path}: must be an object"]
    out: list[str] = []
    if in_junctor:
        out += [
            f"{path}.{k}: must not be specified inside a junctor"
            for k in _NOT_IN_JUNCTORS
            if k in node
        ]
    elif (
        "type" not in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
        and not node.get("x-kubernetes-int-or-string")
    ):
        out.append(f"{path}.type: Required value: must not be empty for specified object fields")
    for key, child in (node.get("properties") or {}).items():
        out += _structural_problems(child, f"{path}.properties[{key}]", in_junctor)
    if isinstance(node.get("items"), dict):
        out += _structural_problems(node["items"], f"{path}.items", in_junctor)
    if isinstance(node.get("additionalProperties"), dict):
        out += _structural_problems(node["additionalProperties"], f"{path}.additionalProperties")
    for j in _JUNCTORS:
        children = node.get(j) or []
        for i, child in enumerate([children] if isinstance(children, dict) else children):
            out += _structural_problems(child, f"{path}.{j}[{i}]", True)
    return out


def register(crd: Obj) -> list[CustomResource]:
    """The resources a CRD serves; ApiError 422 when its schema is not structural."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    group, plural, kind = spec.get("group"), names.get("plural"), names.get("kind")
    if not group or not plural or not kind:
        raise ApiError(
            422, "Invalid", "spec.group, spec.names.plural and spec.names.kind are required"
        )
    if crd["metadata"]["name"] != f"{plural}.{group}":
        raise ApiError(422, "Invalid", f'metadata.name: Invalid value: must be "{plural}.{group}"')
    out = []
    for v in spec.get("versions") or []:
        schema = (v.get("schema") or {}).get("openAPIV3Schema")
        if not schema:
            raise ApiError(
                422,
                "Invalid",
                f"spec.versions[{v.get('name')}].schema.openAPIV3Schema: Required value",
            )
        problems = _structural_problems(schema, "spec.validation.openAPIV3Schema")
        if problems:
            raise ApiError(422, "Invalid", "; ".join(problems))
        _compile_rules(schema)
        out.append(
            CustomResource(
                group,
                v["name"],
                plural,
                kind,
                spec.get("scope") == "Namespaced",
                schema,
                tuple(v.get("additionalPrinterColumns") or ()),
                "status" in (v.get("subresources") or {}),
            )
        )
    return out


_ENV = celpy.Environment()


def _compile_rules(node: Any) -> None:
    if not isinstance(node, dict):
        return
    for rule in node.get("x-kubernetes-validations") or []:
        try:
            _ENV.compile(rule["rule"])
        except Exception as e:  # cel-python raises its own tree
            raise ApiError(
                422, "Invalid", f"x-kubernetes-validations: compilation failed: {e}"
            ) from None
    for child in (node.get("properties") or {}).values():
        _compile_rules(child)
    if isinstance(node.get("items"), dict):
        _compile_rules(node["items"])


def _type_ok(value: Any, kind: str) -> bool:
    if kind == "object":
        return isinstance(value, dict)
    if kind == "array":
        return isinstance(value, list)
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return True


def validate(value: Any, schema: Obj, path: str, errors: list[str], top: bool = False) -> Any:
    """``value`` pruned of unknown fields, typed as the schema says; problems into ``errors``."""
    if value is None:
        if not schema.get("nullable"):
            errors.append(
                f'{path}: Invalid value: "null": {path} in body must be of type {schema.get("type")}'
            )
        return None
    kind = schema.get("type")
    if kind and not _type_ok(value, kind):
        errors.append(f"{path}: Invalid value: {value!r}: {path} in body must be of type {kind}")
        return value
    if kind == "number":
        value = float(value)
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(f'"{e}"' for e in schema["enum"])
        errors.append(f"{path}: Unsupported value: {value!r}: supported values: {allowed}")
    if isinstance(value, str):
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append(
                f"{path}: Invalid value: {value!r}: {path} in body should match '{schema['pattern']}'"
            )
        if "minLength" in schema and len(value) < schema["minLength"]:
            errors.append(
                f"{path}: Invalid value: {value!r}: should be at least {schema['minLength']} chars long"
            )
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(f"{path}: Too long: may not be more than {schema['maxLength']} bytes")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema:
            low, strict = schema["minimum"], schema.get("exclusiveMinimum") is True
            if value < low or (strict and value == low):
                op = "greater than" if strict else "greater than or equal to"
                errors.append(
                    f"{path}: Invalid value: {value}: {path} in body should be {op} {low}"
                )
        if "maximum" in schema:
            high, strict = schema["maximum"], schema.get("exclusiveMaximum") is True
            if value > high or (strict and value == high):
                op = "less than" if strict else "less than or equal to"
                errors.append(
                    f"{path}: Invalid value: {value}: {path} in body should be {op} {high}"
                )
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            errors.append(
                f"{path}: Invalid value: {len(value)}: should have at least {schema['minItems']} items"
            )
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append(
                f"{path}: Too many: {len(value)}: must have at most {schema['maxItems']} items"
            )
        items = schema.get("items")
        if isinstance(items, dict):
            value = [validate(v, items, f"{path}[{i}]", errors) for i, v in enumerate(value)]
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        extra = schema.get("additionalProperties")
        keep_unknown = schema.get("x-kubernetes-preserve-unknown-fields") is True
        out: dict[str, Any] = {}
        for k, v in value.items():
            if top and k in ("apiVersion", "kind", "metadata"):
                out[k] = v
            elif k in props:
                out[k] = validate(v, props[k], f"{path}.{k}" if path else k, errors)
            elif isinstance(extra, dict):
                out[k] = validate(v, extra, f"{path}[{k}]", errors)
            elif keep_unknown:
                out[k] = v
            # else: pruned, as the API server does
        for k in schema.get("required") or []:
            if k not in out:
                where = f"{path}.{k}" if path else k
                errors.append(f"{where}: Required value")
        value = out
    for rule in schema.get("x-kubernetes-validations") or []:
        program = _ENV.program(_ENV.compile(rule["rule"]))
        try:
            ok = program.evaluate({"self": celpy.json_to_cel(value)})
        except Exception as e:  # an evaluation error fails the rule, as on the API server
            ok = False
            detail = str(e)
        else:
            detail = rule.get("message") or f"failed rule: {rule['rule']}"
        if not ok:
            errors.append(f'{path or "<root>"}: Invalid value: "object": {detail}')
    return value


def validate_object(cr: CustomResource, obj: Obj) -> Obj:
    errors: list[str] = []
    pruned = validate(obj, cr.schema, "", errors, top=True)
    if errors:
        name = (obj.get("metadata") or {}).get("name", "")
        raise ApiError(
            422,
            "Invalid",
            f'{cr.kind}.{cr.group} "{name}" is invalid: [' + ", ".join(errors) + "]",
        )
    assert isinstance(pruned, dict)
    return pruned


# ---- printer columns -------------------------------------------------------------------------

_FILTER = re.compile(r'^\[\?\(@\.(\w+)=="([^"]*)"\)\]$')


def jsonpath(obj: Any, path: str) -> Any:
    """kubectl's JSONPath subset used by printer columns: ``.a.b`` and ``[?(@.k=="v")]``."""
    cur: Any = obj
    for part in re.findall(r'\.[A-Za-z0-9_]+|\[\?\(@\.\w+=="[^"]*"\)\]', path):
        if cur is None:
            return None
        m = _FILTER.match(part)
        if m:
            cur = next((i for i in cur or [] if isinstance(i, dict) and i.get(m[1]) == m[2]), None)
        else:
            cur = cur.get(part[1:]) if isinstance(cur, dict) else None
    return cur


def table(cr: CustomResource, items: list[Obj], resource_version: str) -> Obj:
    columns = [{"name": "Name", "type": "string", "format": "name"}] + [
        {"name": c["name"], "type": c["type"], "format": c.get("format", "")} for c in cr.columns
    ]
    rows = [
        {
            "cells": [o["metadata"]["name"]] + [jsonpath(o, c["jsonPath"]) for c in cr.columns],
            "object": {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": o["metadata"],
            },
        }
        for o in items
    ]
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": resource_version},
        "columnDefinitions": columns,
        "rows": rows,
    }
