"""Admin JSON parsed as strictly as a browser or ``jq`` would: NaN / Infinity are errors."""

from __future__ import annotations

import json
from typing import Any

ADMIN_JSON_PATHS = ("/api/decisions", "/api/services", "/api/signals", "/api/overview")
"""Every GET endpoint of the admin plane that answers JSON."""


def _refuse(constant: str) -> Any:
    raise ValueError(f"non-finite number {constant} in JSON")


def strict_json(text: str) -> Any:
    return json.loads(text, parse_constant=_refuse)
