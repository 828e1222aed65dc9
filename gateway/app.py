"""Composition root: builds the data plane, admin plane, scaler loop and platform from Settings."""

from __future__ import annotations

from pathlib import Path

from gateway.settings import Settings


def run(settings: Settings, config_path: Path | None = None) -> int:
    """Run the gateway until SIGINT/SIGTERM; return the process exit code."""
    raise NotImplementedError("the data plane is being built (issue 2)")
