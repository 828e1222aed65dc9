"""Pydantic validation errors in Sluice's words: ``key.path[0].name: problem``.

Shared by every typed input Sluice reads (the config file in ``gateway.settings``, the
workloads of ``sluice simulate``), so each names the key, the value and the allowed range
the same way.  Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError

from scaler.policy import KeyedValueError

_BOUNDS = {
    "greater_than": (">", "gt"),
    "greater_than_equal": (">=", "ge"),
    "less_than": ("<", "lt"),
    "less_than_equal": ("<=", "le"),
}


def format_loc(loc: Iterable[int | str]) -> str:
    """``("services", "api", "routes", 0, "path")`` -> ``services.api.routes[0].path``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def format_error(err: dict[str, Any]) -> tuple[str, str]:
    """One pydantic error -> (key path, problem)."""
    loc = [p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-"))]
    kind = err["type"]
    ctx = err.get("ctx") or {}
    value = err.get("input")
    if kind == "value_error" and isinstance(ctx.get("error"), KeyedValueError):
        keyed: KeyedValueError = ctx["error"]
        parts = [int(p) if p.isdigit() else p for p in keyed.key.split(".")]
        return format_loc([*loc, *parts]), keyed.message
    if kind == "literal_error":
        expected = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        return format_loc(loc), f"must be one of {', '.join(expected)}, got {value!r}"
    if kind == "missing":
        return format_loc(loc), "is required"
    if kind == "extra_forbidden":
        return format_loc(loc), "unknown key"
    if kind in _BOUNDS:
        op, key = _BOUNDS[kind]
        bound = ctx.get(key)
        shown = f"{bound:g}" if isinstance(bound, float) else bound
        return format_loc(loc), f"must be {op} {shown}, got {value!r}"
    if kind == "too_short":
        return format_loc(loc), f"must have at least {ctx.get('min_length')} item(s)"
    if kind == "value_error":
        return format_loc(loc), str(ctx.get("error", err["msg"]))
    msg = err["msg"][0].lower() + err["msg"][1:]
    return format_loc(loc), f"{msg}, got {value!r}"


def validation_problems(e: ValidationError) -> list[tuple[str, str]]:
    """Every problem of ``e`` as (key path, problem), in order."""
    return [format_error(dict(err)) for err in e.errors(include_url=False)]
