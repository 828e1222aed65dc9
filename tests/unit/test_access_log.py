"""Access-log lines: field escaping (text and JSON), buffering until the loop round ends or
the size bound, and reopening (pure: a file in tmp_path, a recorded call_soon)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gateway.dataplane.access_log import FLUSH_BYTES, AccessLog
from gateway.dataplane.errors import Cause


class RecordingLoop:
    """What AccessLog asks of the loop: call_later (recorded, run by hand) and a clock."""

    def __init__(self) -> None:
        self.soon: list[Callable[[], None]] = []
        self.now = 5.0

    def time(self) -> float:
        return self.now

    def call_later(self, delay_s: float, fn: Callable[[], None], *args: Any) -> None:
        self.soon.append(fn)

    def run_round(self) -> None:
        soon, self.soon = self.soon, []
        for fn in soon:
            fn()


def make(tmp_path: Path, fmt: str) -> tuple[AccessLog, RecordingLoop, Path]:
    loop = RecordingLoop()
    path = tmp_path / "access.log"
    return AccessLog(loop, fmt, str(path), wall_clock=lambda: 1_764_072_000.25), loop, path  # type: ignore[arg-type]


def test_hostile_target_is_escaped_in_text(tmp_path: Path) -> None:
    access, loop, path = make(tmp_path, "text")
    access.refused(b"10.0.0.1", Cause.BAD_REQUEST, b"GET", b'/a b"c\\\x01?q="x y"')
    loop.run_round()
    [line] = path.read_text().splitlines()
    assert line.startswith("10.0.0.1 - - [25/Nov/2025:12:00:00.250 +0000] ")
    assert '"GET /a\\x20b\\x22c\\x5c\\x01?q=\\x22x\\x20y\\x22 HTTP/1.1" 400 0 ' in line
    assert line.endswith("cause=bad-request trace=-")


def test_hostile_target_is_valid_json(tmp_path: Path) -> None:
    access, loop, path = make(tmp_path, "json")
    target = '/a b"c\\\x01é?q="x'
    access.refused(b"10.0.0.1", Cause.URI_TOO_LONG, b"", target.encode("latin-1"))
    loop.run_round()
    record = json.loads(path.read_text())
    assert record["path"] == '/a b"c\\\x01é'
    assert record["query"] == 'q="x'
    assert record["method"] is None
    assert record["status"] == Cause.URI_TOO_LONG.status
    assert record["time"] == "2025-11-25T12:00:00.250Z"


def test_lines_wait_for_the_timer_or_the_size_bound(tmp_path: Path) -> None:
    access, loop, path = make(tmp_path, "text")
    access.refused(b"10.0.0.1", Cause.BAD_REQUEST, b"GET", b"/")
    assert path.read_text() == ""  # held until the flush timer fires
    assert len(loop.soon) == 1
    n = 1
    while path.read_text() == "":
        access.refused(b"10.0.0.1", Cause.BAD_REQUEST, b"GET", b"/" + b"x" * 500)
        n += 1
        assert n < FLUSH_BYTES  # bounded: the size bound writes them
    assert len(path.read_text().splitlines()) == n
    assert len(loop.soon) == 1  # one write scheduled per batch, not per line


def test_lines_are_stamped_from_the_loop_clock(tmp_path: Path) -> None:
    access, loop, path = make(tmp_path, "json")
    access.refused(b"10.0.0.1", Cause.BAD_REQUEST, b"GET", b"/")
    loop.now += 0.5  # the wall clock is read once per loop second: 0.25 + 0.5
    access.refused(b"10.0.0.1", Cause.BAD_REQUEST, b"GET", b"/")
    loop.run_round()
    times = [json.loads(line)["time"] for line in path.read_text().splitlines()]
    assert times == ["2025-11-25T12:00:00.250Z", "2025-11-25T12:00:00.750Z"]


def test_reopen_writes_to_a_new_file(tmp_path: Path) -> None:
    access, loop, path = make(tmp_path, "text")
    access.refused(b"10.0.0.1", Cause.BAD_REQUEST, b"GET", b"/one")
    loop.run_round()
    path.rename(tmp_path / "access.log.1")
    access.refused(b"10.0.0.1", Cause.BAD_REQUEST, b"GET", b"/two")
    access.reopen()  # held lines go to the old file first
    access.refused(b"10.0.0.1", Cause.BAD_REQUEST, b"GET", b"/three")
    loop.run_round()
    access.close()
    assert len((tmp_path / "access.log.1").read_text().splitlines()) == 2
    assert "/three" in path.read_text()
