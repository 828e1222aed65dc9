"""The bundled demo app (`python -m gateway.tools.demo`) as a replica runs it: a real process on loopback."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]


class Demo:
    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway.tools.demo", "--port", "0", *args],
            cwd=ROOT,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **(env or {})},
        )
        assert self.proc.stderr is not None
        line = self.proc.stderr.readline()
        assert "listening on" in line, line
        self.address = line.split("listening on ", 1)[1].split()[0]
        self.url = f"http://{self.address}"

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.kill()
        rc = self.proc.wait()
        if self.proc.stderr:
            self.proc.stderr.close()
        return rc


@pytest.fixture
def demo() -> Iterator[Demo]:
    d = Demo()
    try:
        yield d
    finally:
        d.stop()


def test_healthz_and_a_cpu_burning_request(demo: Demo) -> None:
    with httpx.Client(base_url=demo.url, timeout=30) as client:
        health = client.get("/healthz")
        assert (health.status_code, health.text) == (200, "ok\n")
        response = client.get("/anything?cpu_ms=30&sleep_ms=5")
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/json"
        body = response.json()
        assert body["pid"] == demo.proc.pid
        assert (body["cpu_ms"], body["sleep_ms"], body["path"]) == (30, 5, "/anything")
        assert body["wall_ms"] >= 30  # it burned at least that much CPU time, so at least that long


def test_keep_alive_serves_several_requests_on_one_connection(demo: Demo) -> None:
    host, port = demo.address.rsplit(":", 1)

    async def exchange() -> list[bytes]:
        reader, writer = await asyncio.open_connection(host, int(port))
        statuses = []
        for path in ("/healthz", "/?cpu_ms=1", "/healthz"):
            writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            statuses.append(head.split(b"\r\n")[0])
        writer.close()
        await writer.wait_closed()
        return statuses

    assert asyncio.run(exchange()) == [b"HTTP/1.1 200 OK"] * 3


def test_request_bodies_are_read_content_length_and_chunked(demo: Demo) -> None:
    with httpx.Client(base_url=demo.url, timeout=30) as client:
        assert client.post("/upload", content=b"x" * 100_000).status_code == 200
        chunks = (b"a" * 1000 for _ in range(10))
        assert client.post("/upload", content=chunks).status_code == 200
        assert client.get("/healthz").status_code == 200


@pytest.mark.parametrize(
    ("query", "problem"),
    [("cpu_ms=lots", "cpu_ms must be a number"), ("sleep_ms=-1", "sleep_ms must be in 0..60000")],
)
def test_bad_parameters_get_400(demo: Demo, query: str, problem: str) -> None:
    response = httpx.get(f"{demo.url}/?{query}", timeout=30)
    assert response.status_code == 400
    assert problem in response.text


def test_env_default_cpu_ms() -> None:
    d = Demo(env={"DEMO_CPU_MS": "7"})
    try:
        assert httpx.get(f"{d.url}/", timeout=30).json()["cpu_ms"] == 7
        assert httpx.get(f"{d.url}/?cpu_ms=0", timeout=30).json()["cpu_ms"] == 0
    finally:
        d.stop()


def test_bad_env_default_is_refused() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gateway.tools.demo", "--port", "0"],
        cwd=ROOT,
        env={**os.environ, "DEMO_CPU_MS": "much"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode != 0
    assert "DEMO_CPU_MS must be a number of milliseconds, got 'much'" in proc.stderr


def cpu_s(pid: int) -> float:
    """utime + stime of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_sigterm_lets_the_in_flight_request_finish_then_exits_0() -> None:
    d = Demo()
    try:

        async def scenario() -> httpx.Response:
            async with httpx.AsyncClient(timeout=30) as client:
                before = cpu_s(d.proc.pid)
                request = asyncio.create_task(client.get(f"{d.url}/?cpu_ms=300&sleep_ms=100"))
                # Bounded polling until the request is visibly being served (burning CPU).
                for _ in range(1000):
                    if cpu_s(d.proc.pid) - before > 0.05:
                        break
                    await asyncio.sleep(0.01)
                assert not request.done()
                d.proc.send_signal(signal.SIGTERM)
                return await request

        response = asyncio.run(scenario())
        assert response.status_code == 200
        assert d.proc.wait(timeout=30) == 0
    finally:
        d.stop()
