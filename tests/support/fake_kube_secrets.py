"""The API server's rules for Secrets and field selectors, as the fake enforces them (pure).

* a Secret is stored with ``type`` defaulted to ``Opaque``, ``stringData`` merged into
  ``data`` (base64) and dropped; ``data`` values must be base64 (else 400, as the JSON
  decoder of a ``[]byte`` answers) under keys of ``[-._a-zA-Z0-9]``; a
  ``kubernetes.io/tls`` Secret needs ``tls.crt`` and ``tls.key`` (422);
* ``type`` is immutable (422), and so is ``data`` once ``immutable: true`` (422);
* ``fieldSelector`` on list/watch: ``metadata.name`` and ``metadata.namespace`` for every
  resource, ``type`` for Secrets; any other field is a 400 (``field label not supported``).
"""

from __future__ import annotations

import base64
import binascii
import copy
import re

from tests.support.fake_kube_rules import ApiError, Obj

TLS_TYPE = "kubernetes.io/tls"
_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
_FIELDS = {"secrets": ("type",)}
"""Selectable fields beyond metadata.name/namespace, per resource."""


def secret_stored(obj: Obj) -> Obj:
    """``obj`` as the API server stores a Secret (defaults, stringData), or ApiError."""
    out = copy.deepcopy(obj)
    name = out["metadata"]["name"]
    out["type"] = out.get("type") or "Opaque"
    data = dict(out.get("data") or {})
    for k, v in (out.pop("stringData", None) or {}).items():
        data[k] = base64.b64encode(str(v).encode()).decode()
    for k, v in data.items():
        if not _KEY.match(k):
            raise ApiError(
                422,
                "Invalid",
                f'Secret "{name}" is invalid: data[{k}]: Invalid value: "{k}": a valid config '
                "key must consist of alphanumeric characters, '-', '_' or '.'",
            )
        try:
            base64.b64decode(str(v), validate=True)
        except (binascii.Error, ValueError):
            raise ApiError(
                400,
                "BadRequest",
                f'Secret in version "v1" cannot be handled as a Secret: illegal base64 data '
                f"in data[{k}]",
            ) from None
    if out["type"] == TLS_TYPE:
        for k in ("tls.crt", "tls.key"):
            if k not in data:
                raise ApiError(
                    422, "Invalid", f'Secret "{name}" is invalid: data[{k}]: Required value'
                )
    if data:
        out["data"] = data
    else:
        out.pop("data", None)
    return out


def check_secret_update(old: Obj, new: Obj) -> None:
    """What a Secret update may not change (``new`` as stored)."""
    name = old["metadata"]["name"]
    if new.get("type") != old.get("type"):
        raise ApiError(
            422,
            "Invalid",
            f'Secret "{name}" is invalid: type: Invalid value: "{new.get("type")}": field is '
            "immutable",
        )
    if old.get("immutable") and (
        new.get("data") != old.get("data") or new.get("immutable") is not True
    ):
        raise ApiError(
            422,
            "Invalid",
            f'Secret "{name}" is invalid: data: Forbidden: field is immutable when `immutable` '
            "is set",
        )


def check_field_selector(plural: str, selector: str | None) -> None:
    """400 for a field the resource cannot be selected by."""
    for term in (selector or "").split(","):
        if not term:
            continue
        field = re.split(r"!=|==|=", term, maxsplit=1)[0]
        if field not in ("metadata.name", "metadata.namespace", *_FIELDS.get(plural, ())):
            raise ApiError(400, "BadRequest", f"field label not supported: {field}")


def fields_match(obj: Obj, selector: str | None) -> bool:
    """Whether ``obj`` matches a (checked) field selector."""
    meta = obj.get("metadata") or {}
    values = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "type": obj.get("type"),
    }
    for term in (selector or "").split(","):
        if not term:
            continue
        if "!=" in term:
            field, value = term.split("!=", 1)
            if values.get(field) == value:
                return False
        else:
            field, value = term.replace("==", "=").split("=", 1)
            if values.get(field) != value:
                return False
    return True
