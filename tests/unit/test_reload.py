"""Reload: valid configs are applied whole, invalid ones rejected with keyed errors."""

from __future__ import annotations

import os
from pathlib import Path

from gateway.admin.reload import Reloader
from gateway.settings import Settings, load_settings

GOOD = """
services:
  api:
    routes: [{path: /api}]
    endpoints: ["127.0.0.1:9001"]
"""
GOOD2 = GOOD.replace("9001", "9002")
BAD = GOOD + "    limits: {queue: {max: -1}}\n"


def make(tmp_path: Path, text: str = GOOD) -> tuple[Reloader, list[Settings], Path]:
    path = tmp_path / "sluice.yaml"
    path.write_text(text)
    applied: list[Settings] = []
    return Reloader(path, load_settings(path), applied.append), applied, path


def bump(path: Path, text: str) -> None:
    path.write_text(text)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def test_valid_change_is_applied(tmp_path: Path) -> None:
    reloader, applied, path = make(tmp_path)
    bump(path, GOOD2)
    result = reloader.reload("test")
    assert result.ok and result.generation == 2
    assert applied[-1].services["api"].endpoints == ["127.0.0.1:9002"]
    assert reloader.current is applied[-1]


def test_invalid_change_is_rejected_and_old_config_kept(tmp_path: Path) -> None:
    reloader, applied, path = make(tmp_path)
    old = reloader.current
    bump(path, BAD)
    result = reloader.reload("test")
    assert not result.ok
    assert result.problems == [f"{path}: services.api.limits.queue.max: must be >= 0, got -1"]
    assert applied == []
    assert reloader.current is old
    assert result.as_json() == {"ok": False, "generation": 1, "errors": result.problems}


def test_invalid_yaml_is_rejected(tmp_path: Path) -> None:
    reloader, applied, path = make(tmp_path)
    bump(path, "services: [\n")
    result = reloader.reload()
    assert not result.ok and "invalid YAML" in result.problems[0]
    assert applied == []


def test_restart_only_keys_are_rejected(tmp_path: Path) -> None:
    reloader, applied, path = make(tmp_path)
    bump(path, "listen: {port: 1234}\n" + GOOD)
    result = reloader.reload()
    assert result.problems == [
        f"{path}: listen: cannot change while running (restart Sluice to apply it)"
    ]
    assert applied == []


def test_unchanged_content_applies_nothing(tmp_path: Path) -> None:
    reloader, applied, _path = make(tmp_path)
    result = reloader.reload()
    assert result.ok and not result.changed and applied == []


def test_poll_reloads_only_on_content_change(tmp_path: Path) -> None:
    reloader, applied, path = make(tmp_path)
    assert reloader.poll() is None
    bump(path, GOOD)  # touched, same content
    assert reloader.poll() is None
    bump(path, GOOD2)
    result = reloader.poll()
    assert result is not None and result.ok
    assert len(applied) == 1
    assert reloader.poll() is None
    bump(path, BAD)
    bad = reloader.poll()
    assert bad is not None and not bad.ok
    assert reloader.poll() is None  # a rejected version is not retried until it changes
    bump(path, GOOD)
    again = reloader.poll()
    assert again is not None and again.ok and again.generation == 3
