"""Check a manifest's field names and value kinds against the official ``kubernetes``
client's models (generated from the Kubernetes OpenAPI spec), as a server with strict
field validation would: a misspelt or misplaced field is an error, not silently dropped.
"""

from __future__ import annotations

import re
from typing import Any

import kubernetes.client as k8s

_LIST = re.compile(r"^(?:List|list)\[(.+)\]$")
_DICT = re.compile(r"^(?:Dict|dict)\((?:str), (.+)\)$|^(?:Dict|dict)\[str, (.+)\]$")
_SCALARS: dict[str, tuple[type, ...]] = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "bytes": (str,),  # base64 in JSON/YAML
    "datetime": (str,),
    "date": (str,),
    "object": (object,),
}


def model_for(api_version: str, kind: str) -> type | None:
    """The client model class for apiVersion/kind, e.g. apps/v1 Deployment -> V1Deployment."""
    version = api_version.rsplit("/", 1)[-1]
    return getattr(k8s, f"{version.capitalize()}{kind}", None)


def field_errors(manifest: dict[str, Any]) -> list[str]:
    """Problems as ``path: message``; empty when every field is known and well typed."""
    model = model_for(manifest["apiVersion"], manifest["kind"])
    if model is None:
        return [f"{manifest['apiVersion']} {manifest['kind']}: no model to check against"]
    errors: list[str] = []
    _check(manifest, model.__name__, manifest["kind"], errors)
    return errors


def _check(value: Any, type_name: str, path: str, errors: list[str]) -> None:
    if value is None:
        return
    if (match := _LIST.match(type_name)) is not None:
        if not isinstance(value, list):
            errors.append(f"{path}: expected a list, got {type(value).__name__}")
            return
        for i, item in enumerate(value):
            _check(item, match.group(1), f"{path}[{i}]", errors)
        return
    if (match := _DICT.match(type_name)) is not None:
        if not isinstance(value, dict):
            errors.append(f"{path}: expected a mapping, got {type(value).__name__}")
            return
        for key, item in value.items():
            _check(item, match.group(1) or match.group(2), f"{path}.{key}", errors)
        return
    if type_name in _SCALARS:
        if not isinstance(value, _SCALARS[type_name]) or (
            type_name == "int" and isinstance(value, bool)
        ):
            errors.append(f"{path}: expected {type_name}, got {value!r}")
        return
    model = getattr(k8s, type_name, None)
    if model is None:
        errors.append(f"{path}: unknown type {type_name}")
        return
    if not isinstance(value, dict):
        errors.append(f"{path}: expected a {type_name} mapping, got {value!r}")
        return
    by_json = {json_key: attr for attr, json_key in model.attribute_map.items()}
    for key, item in value.items():
        if key not in by_json:
            errors.append(f"{path}.{key}: unknown field of {type_name}")
            continue
        _check(item, model.openapi_types[by_json[key]], f"{path}.{key}", errors)
