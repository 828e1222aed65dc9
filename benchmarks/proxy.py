"""Proxy benchmark: Sluice's data plane against nginx as a reverse proxy, in one run.

    python benchmarks/proxy.py                 # full run (a few minutes)
    python benchmarks/proxy.py --rounds 1 --duration-s 3 --latency-duration-s 2   # quick look
    python benchmarks/proxy.py --skip-sluice   # direct + nginx only
    python benchmarks/proxy.py --h2-only       # HTTP/2 and unary gRPC rows (proxy_h2.py)
    python benchmarks/proxy.py --trace-ratio 0.01   # also Sluice with 1 % of requests traced
    python benchmarks/proxy.py --access-log json    # also Sluice writing a JSON access log
    python benchmarks/proxy.py --websocket          # also the WebSocket echo rows
    python benchmarks/proxy.py --tls           # also both proxies terminating TLS
    python benchmarks/proxy.py --workers 2     # also nginx and Sluice with 2 worker processes
    python benchmarks/proxy.py --workers 2 --limited   # also Sluice (2 workers) with limits

What runs (all on 127.0.0.1, ports picked free, everything stopped at the end):

* **upstream**: an nginx server block answering ``GET /`` with a 3-byte 200 body;
* **nginx proxy**: nginx as a reverse proxy (1 worker, keep-alive upstream pool);
* **Sluice**: ``python -m gateway run --config <generated static config>``;
* **wrk**: ``-c50`` for throughput (req/s, p50, p99 from ``--latency``) and ``-c1`` for the
  latency a proxy adds to a single request (its p50 minus the direct p50).

Core layout (this machine has 2 cores): the proxy under test runs alone on core 0
(``taskset -c 0``); the upstream and wrk share core 1.  Each proxy thus gets exactly one
core, as the issue's target is stated per core, and the load side is identical for every
target so the ratios compare like with like.  The "direct" row (wrk straight to the
upstream) is bounded by core 1, not by a proxy; it is the floor for latency, not a
throughput target.  To tell whether a proxy really saturated its core, the script also
measures the proxy's own CPU time (``/proc``) and reports core utilisation and CPU
microseconds per request.

``--tls`` adds four targets, both proxies terminating TLS 1.3 with the same ECDSA P-256
certificate (made with ``openssl`` per run) in front of the same plain upstream:
``nginx-tls``/``sluice-tls`` (wrk over https with keep-alive: req/s per core) and
``nginx-hs``/``sluice-hs`` (``Connection: close``: every request is a new TCP connection
and a new TLS handshake, so req/s is new handshakes per second; wrk keeps each connection's
TLS session for its next one, so nearly all are resumed TLS 1.3 handshakes, a session
ticket and a new X25519 key exchange, for both proxies alike).  Target (issue 16): TLS
req/s >= 0.6 of nginx's per core.

``--workers N`` adds ``nginx-wN`` (``worker_processes N``) and ``sluice-wN`` (``workers: N``).
Every core is shared for these rows: the proxy (all its processes) and wrk (one thread) may
run on every core (``taskset -c 0-<cores-1>``), the upstream (one nginx worker, the same for
every row) stays on core 1; the kernel splits the cores, and both proxies meet the same load
side.  Ratios:
req/s sluice-wN/nginx-wN (target >= 0.75, issue 16), and CPU per request sluice-wN over the
one-process ``sluice`` row (target: unchanged).

Each round runs direct, nginx and Sluice back to back; ``--rounds`` rounds (default 3)
are reduced to medians.  Targets (issue 2): Sluice/nginx req/s >= 0.5 at c=50, and
Sluice's added p50 latency at c=1 within 2x nginx's.  The result (with the machine
description) is written to ``benchmarks/results/proxy-<UTC date and time>.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import http.client
import json
import os
import platform
import re
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "benchmarks" / "results"
PROXY_CORE = "0"
LOAD_CORE = "1"
ALL_CORES = f"0-{(os.cpu_count() or 1) - 1}"
"""``--workers N`` rows: the proxy, wrk and the upstream may all run on every core."""
WORKERS_TARGET = 0.75
UPSTREAM_BODY = "ok\n"
READY_TIMEOUT_S = 30.0
REQS_TARGET = 0.5
ADDED_LATENCY_TARGET = 2.0
SATURATED = 0.9
TLS_TARGET = 0.6
TLS_TARGETS = ("nginx-tls", "sluice-tls", "nginx-hs", "sluice-hs")
"""``--tls``: keep-alive over TLS, then a new connection (a resumed handshake) per request."""


# ---------------------------------------------------------------- wrk output


@dataclass
class WrkResult:
    """One wrk run, parsed."""

    requests: int
    duration_s: float
    rps: float
    p50_ms: float
    p75_ms: float
    p90_ms: float
    p99_ms: float
    errors: int = 0
    non_2xx: int = 0


_UNIT_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0, "h": 3_600_000.0}
_PERCENTILE = re.compile(r"^\s*(50|75|90|99)(?:\.0+)?%\s+([\d.]+)(us|ms|s|m|h)\s*$", re.M)
_TOTAL = re.compile(r"^\s*(\d+) requests in ([\d.]+)(us|ms|s|m|h)", re.M)
_RPS = re.compile(r"^Requests/sec:\s+([\d.]+)", re.M)
_SOCKET_ERRORS = re.compile(
    r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", re.M
)
_NON_2XX = re.compile(r"Non-2xx or 3xx responses: (\d+)", re.M)


def parse_wrk(output: str) -> WrkResult:
    """Parse ``wrk --latency`` output; raise ValueError naming what is missing."""
    percentiles = {p: float(v) * _UNIT_MS[u] for p, v, u in _PERCENTILE.findall(output)}
    total = _TOTAL.search(output)
    rps = _RPS.search(output)
    missing = [f"{p}%" for p in ("50", "75", "90", "99") if p not in percentiles]
    if total is None:
        missing.append("'N requests in T'")
    if rps is None:
        missing.append("'Requests/sec'")
    if missing or total is None or rps is None:
        raise ValueError(f"wrk output lacks {', '.join(missing)}:\n{output}")
    errors = _SOCKET_ERRORS.search(output)
    non_2xx = _NON_2XX.search(output)
    return WrkResult(
        requests=int(total.group(1)),
        duration_s=float(total.group(2)) * _UNIT_MS[total.group(3)] / 1000.0,
        rps=float(rps.group(1)),
        p50_ms=percentiles["50"],
        p75_ms=percentiles["75"],
        p90_ms=percentiles["90"],
        p99_ms=percentiles["99"],
        errors=sum(int(n) for n in errors.groups()) if errors else 0,
        non_2xx=int(non_2xx.group(1)) if non_2xx else 0,
    )


# ---------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class Process:
    """A child process we started, in its own process group, with its log file."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def group_cpu_s(self) -> float:
        """User + system CPU seconds of every live process in this process group."""
        tick = os.sysconf("SC_CLK_TCK")
        total = 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            # after the command: state ppid pgrp ... utime(12) stime(13), 0-based from state
            if int(fields[2]) == self.popen.pid:
                total += int(fields[11]) + int(fields[12])
        return total / tick

    def tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.popen.pid, signal.SIGKILL)
                self.popen.wait(timeout=timeout_s)
        # nginx workers can outlive a master killed hard: clear the group we own.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)


def start(name: str, argv: list[str], core: str, workdir: Path, cwd: Path = ROOT) -> Process:
    log = workdir / f"{name}.log"
    with log.open("wb") as out:
        popen = subprocess.Popen(
            ["taskset", "-c", core, *argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            start_new_session=True,
        )
    return Process(name, popen, log)


def get(
    port: int, path: str = "/", timeout_s: float = 2.0, host: str = "bench.test"
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request("GET", path, headers={"Host": host})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def get_tls(port: int, path: str = "/", timeout_s: float = 2.0) -> tuple[int, bytes]:
    """``get`` over https (the benchmark's self-signed certificate is not verified)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout_s, context=context)
    try:
        conn.request("GET", path, headers={"Host": "bench.test"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def wait_until_serving(proc: Process, port: int, path: str = "/", status: int = 200) -> None:
    """Poll (bounded) until ``GET path`` on ``port`` answers ``status``."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    last = "no answer"
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.tail()}")
        try:
            # The admin plane answers only its own address as Host (DNS rebinding defence).
            host = f"127.0.0.1:{port}" if path == "/readyz" else "bench.test"
            got, _ = get(port, path, timeout_s=1.0, host=host)
            if got == status:
                return
            last = f"status {got}"
        except OSError as e:
            last = str(e)
        time.sleep(0.1)
    raise RuntimeError(f"{proc.name} not serving {path} on {port} ({last}):\n{proc.tail()}")


# ---------------------------------------------------------------- setup


def ensure_tools() -> None:
    """Install nginx and wrk with apt-get when missing (one ``apt-get update`` first)."""
    missing = [
        pkg for pkg, binary in (("nginx-light", "nginx"), ("wrk", "wrk")) if not _which(binary)
    ]
    if not missing:
        return
    if not shutil.which("apt-get"):
        raise SystemExit(f"missing {', '.join(missing)} and no apt-get to install them")
    print(f"installing {', '.join(missing)} with apt-get ...", flush=True)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env, stdout=subprocess.DEVNULL)
    subprocess.run(
        ["apt-get", "install", "-y", "-q", *missing], check=True, env=env, stdout=subprocess.DEVNULL
    )


def _which(binary: str) -> str | None:
    return shutil.which(binary) or shutil.which(binary, path="/usr/sbin:/sbin")


NGINX_MAIN = """\
worker_processes {workers};
pid {dir}/{name}.pid;
error_log {dir}/{name}.error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {dir}/{name}.body;
  proxy_temp_path {dir}/{name}.proxy;
  fastcgi_temp_path {dir}/{name}.fastcgi;
  uwsgi_temp_path {dir}/{name}.uwsgi;
  scgi_temp_path {dir}/{name}.scgi;
  keepalive_requests 1000000;
  keepalive_timeout 75s;
{body}
}}
"""

UPSTREAM_SERVER = """\
  server {{
    listen 127.0.0.1:{port};
    location / {{ default_type text/plain; return 200 "{body}"; }}
  }}
"""

PROXY_SERVER = """\
  upstream backend {{
    server 127.0.0.1:{upstream_port};
    keepalive 64;
    keepalive_requests 1000000;
  }}
  server {{
    listen 127.0.0.1:{port};
{tls}    location / {{
      proxy_pass http://backend;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $host;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
    }}
  }}
"""

NGINX_TLS = """\
    listen 127.0.0.1:{tls_port} ssl;
    ssl_certificate {cert};
    ssl_certificate_key {key};
    ssl_protocols TLSv1.2 TLSv1.3;
"""
SLUICE_TLS = """\
tls:
  listen: {{host: 127.0.0.1, port: {tls_port}}}
  certificates: [{{cert_file: {cert}, key_file: {key}}}]
"""


def make_certificate(workdir: Path) -> tuple[Path, Path]:
    """A self-signed ECDSA P-256 certificate for bench.test (``openssl``): (cert, key)."""
    cert, key = workdir / "bench.pem", workdir / "bench.key"
    argv = ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
    argv += ["-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2"]
    argv += ["-subj", "/CN=bench.test", "-addext", "subjectAltName=DNS:bench.test"]
    subprocess.run(argv, check=True, capture_output=True, timeout=30)
    return cert, key


TRACE_TARGET = 0.95
TRACED_CONFIG = """\
telemetry:
  traces:
    enabled: true
    sampler: {{type: parentbased_ratio, ratio: {ratio}}}
    exporter: otlp_http
    endpoint: "http://127.0.0.1:{upstream_port}/v1/traces"
"""
"""``--trace-ratio``: spans are exported over OTLP/HTTP to the nginx upstream (any POST gets 200),
so the traced run pays for recording, encoding and sending, not for a collector's work."""

SLUICE_CONFIG = """\
# generated by benchmarks/proxy.py
listen: {{host: 127.0.0.1, port: {port}}}
admin: {{host: 127.0.0.1, port: {admin_port}}}
platform: static
services:
  bench:
    routes:
      - {{path: /, path_type: Prefix}}
    endpoints: ["127.0.0.1:{upstream_port}"]
"""

LIMITS_CONFIG = """\
    limits:
      concurrency_per_replica: 100000
      queue: {max: 1000}
      rate_limit: {rps: 10000000, burst: 100000}
"""
"""``--limited``: a concurrency limit and a rate limit that never bind (what is measured is
their cost: with ``workers: N`` every admission and release takes the shared row's lock)."""


def start_upstream(workdir: Path, body: str = UPSTREAM_BODY) -> tuple[Process, int]:
    """The fast upstream (nginx answering ``body``) on the load core, serving: (process, port).
    Stopped again if it does not come up."""
    port = free_port()
    server = UPSTREAM_SERVER.format(port=port, body=body.replace("\n", "\\n"))
    upstream = start_nginx("upstream", server, LOAD_CORE, workdir)
    try:
        wait_until_serving(upstream, port)
    except BaseException:
        upstream.stop()
        raise
    return upstream, port


def start_gateway(
    name: str,
    workdir: Path,
    upstream_port: int,
    *,
    extra_config: str = "",
    cwd: Path = ROOT,
    core: str = PROXY_CORE,
    limits: bool = False,
) -> tuple[Process, int]:
    """A Sluice gateway (``cwd``'s tree, default this one) in front of the upstream, on the
    proxy core, ready and serving: (process, data-plane port).  Stopped again if it does not
    come up."""
    port, admin = free_port(), free_port()
    config = workdir / f"{name}.yaml"
    config.write_text(
        SLUICE_CONFIG.format(port=port, admin_port=admin, upstream_port=upstream_port)
        + (LIMITS_CONFIG if limits else "")
        + extra_config
    )
    argv = [sys.executable, "-m", "gateway", "run", "--config", str(config)]
    proc = start(name, argv, core, workdir, cwd=cwd)
    try:
        wait_until_serving(proc, admin, "/readyz")
        wait_until_serving(proc, port)
    except BaseException:
        proc.stop()
        raise
    return proc, port


def start_nginx(
    name: str, server_block: str, core: str, workdir: Path, workers: int = 1
) -> Process:
    conf = workdir / f"{name}.conf"
    conf.write_text(NGINX_MAIN.format(dir=workdir, name=name, body=server_block, workers=workers))
    nginx = _which("nginx") or "nginx"
    argv = [nginx, "-p", str(workdir), "-e", str(workdir / f"{name}.error.log"), "-c", str(conf)]
    argv += ["-g", "daemon off; master_process on;"]
    return start(name, argv, core, workdir)


# ---------------------------------------------------------------- measuring


@dataclass
class Sample:
    """One target in one round."""

    target: str
    c50: WrkResult
    c1: WrkResult
    proxy_cpu_us_per_request: float | None = None
    proxy_core_utilisation: float | None = None
    loadavg_1m: float | None = None


@dataclass
class Run:
    args: dict[str, Any]
    machine: dict[str, Any]
    samples: list[Sample] = field(default_factory=list)
    websocket: dict[str, Any] | None = None


def wrk(
    port: int,
    connections: int,
    duration_s: float,
    timeout_s: float,
    scheme: str = "http",
    close: bool = False,
    core: str = LOAD_CORE,
) -> WrkResult:
    argv = ["taskset", "-c", core, "wrk", "-t1", f"-c{connections}", f"-d{duration_s:g}s"]
    argv += ["--latency", "-H", "Host: bench.test"]
    if close:  # a new connection (and TLS handshake) per request
        argv += ["-H", "Connection: close"]
    argv.append(f"{scheme}://127.0.0.1:{port}/")
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=timeout_s)
    return parse_wrk(out.stdout)


def _how(target: str) -> tuple[str, bool]:
    """(scheme, close) wrk uses for ``target``."""
    return ("https" if target in TLS_TARGETS else "http"), target.endswith("-hs")


def load_core(target: str) -> str:
    """The cores wrk runs on for ``target`` (every core for the ``-wN`` rows)."""
    return ALL_CORES if re.search(r"-w\d+$", target) else LOAD_CORE


def measure(target: str, port: int, proxy: Process | None, args: argparse.Namespace) -> Sample:
    timeout_s = args.duration_s + 30
    scheme, close = _how(target)
    core = load_core(target)
    cpu_before = proxy.group_cpu_s() if proxy else 0.0
    wall_before = time.monotonic()
    c50 = wrk(port, args.connections, args.duration_s, timeout_s, scheme, close, core)
    wall_s = time.monotonic() - wall_before
    cpu_s = (proxy.group_cpu_s() - cpu_before) if proxy else 0.0
    c1 = wrk(port, 1, args.latency_duration_s, timeout_s, scheme, close, core)
    sample = Sample(target, c50, c1, loadavg_1m=os.getloadavg()[0])
    if proxy is not None and c50.requests:
        sample.proxy_cpu_us_per_request = cpu_s / c50.requests * 1e6
        sample.proxy_core_utilisation = cpu_s / wall_s
    return sample


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def summarise(samples: list[Sample]) -> dict[str, dict[str, float | None]]:
    """Median per target over the rounds."""
    table: dict[str, dict[str, float | None]] = {}
    for target in dict.fromkeys(s.target for s in samples):
        mine = [s for s in samples if s.target == target]
        table[target] = {
            "rps": _median([s.c50.rps for s in mine]),
            "p50_ms": _median([s.c50.p50_ms for s in mine]),
            "p99_ms": _median([s.c50.p99_ms for s in mine]),
            "c1_p50_ms": _median([s.c1.p50_ms for s in mine]),
            "c1_p99_ms": _median([s.c1.p99_ms for s in mine]),
            "cpu_us_per_request": _median([s.proxy_cpu_us_per_request for s in mine]),
            "core_utilisation": _median([s.proxy_core_utilisation for s in mine]),
            "errors": float(sum(s.c50.errors + s.c1.errors for s in mine)),
            "non_2xx": float(sum(s.c50.non_2xx + s.c1.non_2xx for s in mine)),
        }
    return table


def ratios(table: dict[str, dict[str, float | None]]) -> dict[str, float | None]:
    """Sluice against nginx: throughput ratio and added-latency ratio at c=1."""
    if "sluice" not in table or "nginx" not in table:
        return {}
    s, n, d = table["sluice"], table["nginx"], table["direct"]
    out: dict[str, float | None] = {}
    if s["rps"] and n["rps"]:
        out["rps_sluice_over_nginx"] = s["rps"] / n["rps"]
    cores = [s["core_utilisation"], n["core_utilisation"]]
    if None not in cores:
        out["both_proxies_saturated"] = min(c for c in cores if c is not None) >= SATURATED
    if s["cpu_us_per_request"] and n["cpu_us_per_request"]:
        out["cpu_per_request_sluice_over_nginx"] = s["cpu_us_per_request"] / n["cpu_us_per_request"]
    b = table.get("baseline")
    if b is not None and b["cpu_us_per_request"] and n["cpu_us_per_request"]:
        out["cpu_per_request_baseline_over_nginx"] = (
            b["cpu_us_per_request"] / n["cpu_us_per_request"]
        )
    if b is not None and b["rps"] and n["rps"]:
        out["rps_baseline_over_nginx"] = b["rps"] / n["rps"]
    lg = table.get("logged")
    if lg is not None and lg["rps"] and s["rps"]:
        out["rps_logged_over_sluice"] = lg["rps"] / s["rps"]
    if lg is not None and lg["cpu_us_per_request"] and s["cpu_us_per_request"]:
        out["cpu_per_request_logged_over_sluice"] = (
            lg["cpu_us_per_request"] / s["cpu_us_per_request"]
        )
    t = table.get("traced")
    if t is not None and t["rps"] and s["rps"]:
        out["rps_traced_over_sluice"] = t["rps"] / s["rps"]
    if t is not None and t["cpu_us_per_request"] and s["cpu_us_per_request"]:
        out["cpu_per_request_traced_over_sluice"] = (
            t["cpu_us_per_request"] / s["cpu_us_per_request"]
        )
    if s["c1_p50_ms"] is not None and n["c1_p50_ms"] is not None and d["c1_p50_ms"] is not None:
        sluice_added = s["c1_p50_ms"] - d["c1_p50_ms"]
        nginx_added = n["c1_p50_ms"] - d["c1_p50_ms"]
        out["c1_added_p50_ms_sluice"] = sluice_added
        out["c1_added_p50_ms_nginx"] = nginx_added
        out["c1_added_p50_sluice_over_nginx"] = (
            sluice_added / nginx_added if nginx_added > 0 else None
        )
    out.update(tls_ratios(table))
    out.update(workers_ratios(table))
    return out


def workers_ratios(table: dict[str, dict[str, float | None]]) -> dict[str, float | None]:
    """``--workers N``: sluice-wN against nginx-wN, and its CPU per request against the
    one-process ``sluice`` row."""
    out: dict[str, float | None] = {}
    for target, row in table.items():
        m = re.fullmatch(r"sluice-w(\d+)", target)
        if m is None:
            continue
        n = m.group(1)
        peer, one = table.get(f"nginx-w{n}"), table.get("sluice")
        if peer is not None and row["rps"] and peer["rps"]:
            out[f"rps_sluice_w{n}_over_nginx_w{n}"] = row["rps"] / peer["rps"]
        if peer is not None and row["cpu_us_per_request"] and peer["cpu_us_per_request"]:
            out[f"cpu_per_request_sluice_w{n}_over_nginx_w{n}"] = (
                row["cpu_us_per_request"] / peer["cpu_us_per_request"]
            )
        if one is not None and row["cpu_us_per_request"] and one["cpu_us_per_request"]:
            out[f"cpu_per_request_sluice_w{n}_over_sluice"] = (
                row["cpu_us_per_request"] / one["cpu_us_per_request"]
            )
        if one is not None and row["rps"] and one["rps"]:
            out[f"rps_sluice_w{n}_over_sluice"] = row["rps"] / one["rps"]
        limited = table.get(f"limited-w{n}")
        if limited is not None and limited["rps"] and row["rps"]:
            out[f"rps_limited_w{n}_over_sluice_w{n}"] = limited["rps"] / row["rps"]
        if limited is not None and limited["cpu_us_per_request"] and row["cpu_us_per_request"]:
            out[f"cpu_per_request_limited_w{n}_over_sluice_w{n}"] = (
                limited["cpu_us_per_request"] / row["cpu_us_per_request"]
            )
    return out


def print_workers_ratios(rat: dict[str, float | None]) -> None:
    for key, value in rat.items():
        m = re.fullmatch(r"rps_sluice_w(\d+)_over_nginx_w\d+", key)
        if m is None or value is None:
            continue
        n = m.group(1)
        verdict = "met" if value >= WORKERS_TARGET else "NOT met"
        print(
            f"req/s sluice-w{n}/nginx-w{n} (c=50, cores shared): {value:.2f}"
            f"  (target >= {WORKERS_TARGET}: {verdict})"
        )
        print(
            f"CPU per request sluice-w{n}/nginx-w{n}:            "
            f"{_fmt(rat.get(f'cpu_per_request_sluice_w{n}_over_nginx_w{n}'), '.2f')}"
        )
        print(
            f"CPU per request sluice-w{n}/sluice (1 worker):    "
            f"{_fmt(rat.get(f'cpu_per_request_sluice_w{n}_over_sluice'), '.2f')}"
            f"  (req/s {_fmt(rat.get(f'rps_sluice_w{n}_over_sluice'), '.2f')}x)"
        )
        limited = rat.get(f"rps_limited_w{n}_over_sluice_w{n}")
        if limited is not None:
            print(
                f"limits shared by {n} workers: req/s {limited:.2f}x, CPU per request "
                f"{_fmt(rat.get(f'cpu_per_request_limited_w{n}_over_sluice_w{n}'), '.2f')}x "
                f"of sluice-w{n} (no limits)"
            )


def tls_ratios(table: dict[str, dict[str, float | None]]) -> dict[str, float | None]:
    """``--tls``: Sluice against nginx, both terminating TLS (keep-alive and handshakes)."""
    out: dict[str, float | None] = {}
    d = table.get("direct")
    for kind in ("tls", "hs"):
        s, n = table.get(f"sluice-{kind}"), table.get(f"nginx-{kind}")
        if s is None or n is None:
            continue
        if s["rps"] and n["rps"]:
            out[f"rps_sluice_{kind}_over_nginx_{kind}"] = s["rps"] / n["rps"]
        if s["cpu_us_per_request"] and n["cpu_us_per_request"]:
            out[f"cpu_per_request_sluice_{kind}_over_nginx_{kind}"] = (
                s["cpu_us_per_request"] / n["cpu_us_per_request"]
            )
        if (
            kind == "tls"
            and d is not None
            and None
            not in (
                s["c1_p50_ms"],
                n["c1_p50_ms"],
                d["c1_p50_ms"],
            )
        ):
            sluice_added = s["c1_p50_ms"] - d["c1_p50_ms"]  # type: ignore[operator]
            nginx_added = n["c1_p50_ms"] - d["c1_p50_ms"]  # type: ignore[operator]
            out["c1_added_p50_ms_sluice_tls"] = sluice_added
            out["c1_added_p50_ms_nginx_tls"] = nginx_added
            out["c1_added_p50_sluice_tls_over_nginx_tls"] = (
                sluice_added / nginx_added if nginx_added > 0 else None
            )
    return out


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_table(table: dict[str, dict[str, float | None]], rat: dict[str, float | None]) -> None:
    header = (
        f"{'target':<10} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'c1 p50':>8} {'c1 p99':>8} "
        f"{'cpu us/req':>10} {'core':>6} {'errors':>6}"
    )
    print(header)
    print("-" * len(header))
    for target, row in table.items():
        errors = (row["errors"] or 0) + (row["non_2xx"] or 0)
        print(
            f"{target:<10} {_fmt(row['rps'], ',.0f'):>9} {_fmt(row['p50_ms'], '.3f'):>8} "
            f"{_fmt(row['p99_ms'], '.3f'):>8} {_fmt(row['c1_p50_ms'], '.3f'):>8} "
            f"{_fmt(row['c1_p99_ms'], '.3f'):>8} {_fmt(row['cpu_us_per_request'], '.1f'):>10} "
            f"{_fmt(row['core_utilisation'], '.0%'):>6} {errors:>6.0f}"
        )
    busy = [
        f"{target} {row['core_utilisation']:.0%}"
        for target, row in table.items()
        if row["core_utilisation"] is not None
        and row["core_utilisation"] < SATURATED
        and load_core(target) == LOAD_CORE  # one-core rows (-wN rows share every core)
    ]
    if busy:
        print(
            f"\nwarning: a proxy used less than {SATURATED:.0%} of its core ({', '.join(busy)}): "
            "something else ran on core 0, so req/s understate it; CPU us/req is the fairer figure"
        )
    if not rat:
        return
    print()
    r = rat.get("rps_sluice_over_nginx")
    verdict = (
        ""
        if r is None
        else "  (inconclusive: a proxy did not get its whole core)"
        if busy
        else ("  (target >= 0.5: met)" if r >= REQS_TARGET else "  (target >= 0.5: NOT met)")
    )
    print(f"req/s Sluice/nginx (c=50):            {_fmt(r, '.2f')}{verdict}")
    print(
        "CPU per request Sluice/nginx:          "
        f"{_fmt(rat.get('cpu_per_request_sluice_over_nginx'), '.2f')}"
    )
    a = rat.get("c1_added_p50_sluice_over_nginx")
    verdict = (
        ""
        if a is None
        else "  (inconclusive: a proxy did not get its whole core)"
        if busy
        else ("  (target <= 2: met)" if a <= ADDED_LATENCY_TARGET else "  (target <= 2: NOT met)")
    )
    print(
        "added p50 at c=1 (ms) Sluice / nginx:  "
        f"{_fmt(rat.get('c1_added_p50_ms_sluice'), '.3f')} / "
        f"{_fmt(rat.get('c1_added_p50_ms_nginx'), '.3f')} = {_fmt(a, '.2f')}{verdict}"
    )
    bc = rat.get("cpu_per_request_baseline_over_nginx")
    if bc is not None:
        print(
            f"baseline tree: req/s/nginx {_fmt(rat.get('rps_baseline_over_nginx'), '.2f')}, "
            f"CPU per request/nginx {bc:.2f}"
        )
    print_tls_ratios(rat, bool(busy))
    print_workers_ratios(rat)
    lg = rat.get("rps_logged_over_sluice")
    if lg is not None:
        verdict = (
            "  (target >= 0.9: met)" if lg >= ACCESS_LOG_TARGET else "  (target >= 0.9: NOT met)"
        )
        print(f"req/s access log on/off (c=50):       {lg:.3f}{verdict}")
        print(
            "CPU per request access log on/off:     "
            f"{_fmt(rat.get('cpu_per_request_logged_over_sluice'), '.3f')}"
        )
    tr = rat.get("rps_traced_over_sluice")
    if tr is None:
        return
    verdict = "  (target >= 0.95: met)" if tr >= TRACE_TARGET else "  (target >= 0.95: NOT met)"
    print(f"req/s traced/untraced Sluice (c=50):  {tr:.3f}{verdict}")
    print(
        "CPU per request traced/untraced:       "
        f"{_fmt(rat.get('cpu_per_request_traced_over_sluice'), '.3f')}"
    )


def print_tls_ratios(rat: dict[str, float | None], busy: bool) -> None:
    r = rat.get("rps_sluice_tls_over_nginx_tls")
    if r is None:
        return
    verdict = (
        "  (inconclusive: a proxy did not get its whole core)"
        if busy
        else f"  (target >= {TLS_TARGET}: {'met' if r >= TLS_TARGET else 'NOT met'})"
    )
    print(f"TLS req/s Sluice/nginx (c=50, keep-alive): {r:.2f}{verdict}")
    print(
        "TLS CPU per request Sluice/nginx:          "
        f"{_fmt(rat.get('cpu_per_request_sluice_tls_over_nginx_tls'), '.2f')}"
    )
    print(
        "TLS new handshakes/s Sluice/nginx:         "
        f"{_fmt(rat.get('rps_sluice_hs_over_nginx_hs'), '.2f')} (CPU per handshake "
        f"{_fmt(rat.get('cpu_per_request_sluice_hs_over_nginx_hs'), '.2f')})"
    )
    a = rat.get("c1_added_p50_sluice_tls_over_nginx_tls")
    print(
        "TLS added p50 at c=1 (ms) Sluice / nginx:  "
        f"{_fmt(rat.get('c1_added_p50_ms_sluice_tls'), '.3f')} / "
        f"{_fmt(rat.get('c1_added_p50_ms_nginx_tls'), '.3f')} = {_fmt(a, '.2f')}"
    )


# ---------------------------------------------------------------- access log, WebSocket echo

ACCESS_LOG_TARGET = 0.9
WS_TARGETS = ("direct", "nginx", "sluice")

WS_PROXY_SERVER = """\
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://127.0.0.1:{upstream_port};
      proxy_http_version 1.1;
      proxy_set_header Upgrade $http_upgrade;
      proxy_set_header Connection "upgrade";
      proxy_read_timeout 300s;
    }}
  }}
"""

WS_SLUICE_CONFIG = """\
# generated by benchmarks/proxy.py --websocket
listen: {{host: 127.0.0.1, port: {port}}}
admin: {{host: 127.0.0.1, port: {admin_port}}}
platform: static
services:
  echo:
    routes:
      - {{path: /, path_type: Prefix}}
    endpoints: ["127.0.0.1:{upstream_port}"]
"""


def wait_for_port(proc: Process, port: int) -> None:
    """Poll (bounded) until ``port`` accepts a connection."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.popen.poll() is not None:
            raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.tail()}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1.0):
            return
        time.sleep(0.1)
    raise RuntimeError(f"{proc.name} not listening on {port}:\n{proc.tail()}")


def ws_client(port: int, args: argparse.Namespace) -> dict[str, float]:
    argv = ["taskset", "-c", LOAD_CORE, sys.executable, str(ROOT / "benchmarks" / "ws_echo.py")]
    argv += ["client", "--port", str(port), "--connections", str(args.ws_connections)]
    argv += ["--duration-s", f"{args.duration_s:g}", "--size", str(args.ws_size)]
    out = subprocess.run(
        argv, capture_output=True, text=True, check=True, timeout=args.duration_s + 60
    )
    result: dict[str, float] = json.loads(out.stdout)
    return result


def measure_websocket(
    args: argparse.Namespace, workdir: Path, processes: list[Process]
) -> dict[str, Any]:
    """WebSocket echo straight to the upstream, through nginx and through Sluice, in rounds
    (each proxy alone on the proxy core; the echo server and the client on the load core)."""
    echo_port = free_port()
    echo = start(
        "ws-echo",
        [
            sys.executable,
            str(ROOT / "benchmarks" / "ws_echo.py"),
            "serve",
            "--port",
            str(echo_port),
        ],
        LOAD_CORE,
        workdir,
    )
    processes.append(echo)
    wait_for_port(echo, echo_port)
    nginx_port = free_port()
    nginx = start_nginx(
        "nginx-ws",
        WS_PROXY_SERVER.format(port=nginx_port, upstream_port=echo_port),
        PROXY_CORE,
        workdir,
    )
    processes.append(nginx)
    wait_for_port(nginx, nginx_port)
    port, admin = free_port(), free_port()
    config = workdir / "sluice-ws.yaml"
    config.write_text(WS_SLUICE_CONFIG.format(port=port, admin_port=admin, upstream_port=echo_port))
    argv = [sys.executable, "-m", "gateway", "run", "--config", str(config)]
    sluice = start("sluice-ws", argv, PROXY_CORE, workdir)
    processes.append(sluice)
    wait_until_serving(sluice, admin, "/readyz")
    targets: list[tuple[str, int, Process | None]] = [
        ("direct", echo_port, None),
        ("nginx", nginx_port, nginx),
        ("sluice", port, sluice),
    ]
    samples: list[dict[str, Any]] = []
    for round_no in range(1, args.rounds + 1):
        for name, target_port, proc in targets:
            cpu_before = proc.group_cpu_s() if proc else 0.0
            result = ws_client(target_port, args)
            cpu_s = (proc.group_cpu_s() - cpu_before) if proc else 0.0
            if proc is not None and result["messages"]:
                result["cpu_us_per_message"] = cpu_s / result["messages"] * 1e6
            samples.append({"target": name, **result})
            print(
                f"round {round_no}/{args.rounds} ws {name:<7} {result['mps']:>9,.0f} msg/s "
                f"p50 {result['p50_ms']:.3f} ms p99 {result['p99_ms']:.3f} ms",
                flush=True,
            )
    median: dict[str, dict[str, float | None]] = {}
    for name in WS_TARGETS:
        mine = [x for x in samples if x["target"] == name]
        median[name] = {
            key: _median([x.get(key) for x in mine])
            for key in ("mps", "p50_ms", "p99_ms", "cpu_us_per_message")
        }
    d, n, sl = median["direct"], median["nginx"], median["sluice"]
    rat: dict[str, float | None] = {}
    if sl["mps"] and d["mps"]:
        rat["mps_sluice_over_direct"] = sl["mps"] / d["mps"]
    if sl["mps"] and n["mps"]:
        rat["mps_sluice_over_nginx"] = sl["mps"] / n["mps"]
    if sl["p99_ms"] is not None and d["p99_ms"] is not None:
        rat["p99_added_ms_sluice"] = sl["p99_ms"] - d["p99_ms"]
    if n["p99_ms"] is not None and d["p99_ms"] is not None:
        rat["p99_added_ms_nginx"] = n["p99_ms"] - d["p99_ms"]
    if sl["cpu_us_per_message"] and n["cpu_us_per_message"]:
        rat["cpu_per_message_sluice_over_nginx"] = (
            sl["cpu_us_per_message"] / n["cpu_us_per_message"]
        )
    print()
    print(
        f"WebSocket echo ({args.ws_connections} sockets, {args.ws_size}-byte messages, "
        "medians of the rounds)"
    )
    print(f"{'target':<8} {'msg/s':>10} {'p50 ms':>8} {'p99 ms':>8} {'CPU us/msg':>11}")
    for name in WS_TARGETS:
        row = median[name]
        print(
            f"{name:<8} {_fmt(row['mps'], ',.0f'):>10} {_fmt(row['p50_ms'], '.3f'):>8} "
            f"{_fmt(row['p99_ms'], '.3f'):>8} {_fmt(row['cpu_us_per_message'], '.1f'):>11}"
        )
    for key, value in rat.items():
        print(f"  {key}: {_fmt(value, '.3f')}")
    return {"samples": samples, "median": median, "ratios": rat}


# ---------------------------------------------------------------- machine


def _version(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unavailable ({e})"
    text = (out.stdout + out.stderr).strip().splitlines()
    return text[0] if text else ""


def machine() -> dict[str, Any]:
    cpu_model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    from importlib.metadata import PackageNotFoundError, version

    packages = {}
    for name in ("uvloop", "httptools"):
        try:
            packages[name] = version(name)
        except PackageNotFoundError:
            packages[name] = None
    commit = _version(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"])
    return {
        "cpu_model": cpu_model,
        "cores": os.cpu_count(),
        "kernel": platform.release(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "nginx": _version([_which("nginx") or "nginx", "-v"]),
        "wrk": _version(["wrk", "--version"]),
        "packages": packages,
        "sluice_commit": commit,
        "loadavg_at_start": os.getloadavg(),
    }


# ---------------------------------------------------------------- main


@contextlib.contextmanager
def stopping(processes: list[Process]) -> Iterator[None]:
    """Stop every started process on exit, also on SIGTERM/SIGINT."""

    def on_signal(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, on_signal)
    try:
        yield
    finally:
        for proc in reversed(processes):
            proc.stop()
        signal.signal(signal.SIGTERM, previous)


def run(args: argparse.Namespace) -> Run:
    result = Run(args={k: str(v) for k, v in vars(args).items()}, machine=machine())
    processes: list[Process] = []
    with tempfile.TemporaryDirectory(prefix="sluice-bench-") as tmp, stopping(processes):
        workdir = Path(tmp)
        upstream, upstream_port = start_upstream(workdir)
        processes.append(upstream)
        nginx_port = free_port()
        nginx_tls = sluice_tls = ""
        if args.tls:
            cert, key = make_certificate(workdir)
            nginx_tls_port, sluice_tls_port = free_port(), free_port()
            nginx_tls = NGINX_TLS.format(tls_port=nginx_tls_port, cert=cert, key=key)
            sluice_tls = SLUICE_TLS.format(tls_port=sluice_tls_port, cert=cert, key=key)
        nginx = start_nginx(
            "nginx",
            PROXY_SERVER.format(port=nginx_port, upstream_port=upstream_port, tls=nginx_tls),
            PROXY_CORE,
            workdir,
        )
        processes.append(nginx)
        targets: list[tuple[str, int, Process | None]] = [
            ("direct", upstream_port, None),
            ("nginx", nginx_port, nginx),
        ]
        wait_until_serving(nginx, nginx_port)
        gateways: list[tuple[str, dict[str, Any]]] = []
        if not args.skip_sluice:
            gateways.append(("sluice", {"extra_config": sluice_tls}))
            if args.baseline_tree is not None:
                gateways.append(("baseline", {"cwd": args.baseline_tree}))
            if args.trace_ratio is not None:
                traced = TRACED_CONFIG.format(ratio=args.trace_ratio, upstream_port=upstream_port)
                gateways.append(("traced", {"extra_config": traced}))
            if args.access_log is not None:
                logged = (
                    f"access_log: {{enabled: true, format: {args.access_log}, "
                    f"path: {workdir / 'access.log'}}}\n"
                )
                gateways.append(("logged", {"extra_config": logged}))
        if args.workers > 1:
            n = args.workers
            multi_port = free_port()
            multi = start_nginx(
                f"nginx-w{n}",
                PROXY_SERVER.format(port=multi_port, upstream_port=upstream_port, tls=""),
                ALL_CORES,
                workdir,
                workers=n,
            )
            processes.append(multi)
            wait_until_serving(multi, multi_port)
            targets.append((f"nginx-w{n}", multi_port, multi))
            if not args.skip_sluice:
                gateways.append(
                    (f"sluice-w{n}", {"extra_config": f"workers: {n}\n", "core": ALL_CORES})
                )
                if args.limited:
                    gateways.append(
                        (
                            f"limited-w{n}",
                            {"extra_config": f"workers: {n}\n", "core": ALL_CORES, "limits": True},
                        )
                    )
        for name, options in gateways:
            gateway, port = start_gateway(name, workdir, upstream_port, **options)
            processes.append(gateway)
            targets.append((name, port, gateway))
            if args.tls and name == "sluice":
                targets.append(("sluice-tls", sluice_tls_port, gateway))
                targets.append(("sluice-hs", sluice_tls_port, gateway))
        if args.tls:
            targets[2:2] = [
                ("nginx-tls", nginx_tls_port, nginx),
                ("nginx-hs", nginx_tls_port, nginx),
            ]
        for name, port, _ in targets:
            if name in TLS_TARGETS:
                status, body = get_tls(port)
            else:
                status, body = get(port)
            if status != 200 or body.decode() != UPSTREAM_BODY:
                raise RuntimeError(f"{name} answered {status} {body!r}, not the upstream's body")
            # warm-up: connection pools, caches
            wrk(port, args.connections, 1, 30, *_how(name), load_core(name))
        for round_no in range(1, args.rounds + 1):
            for name, port, proc in targets:
                sample = measure(name, port, proc, args)
                result.samples.append(sample)
                print(
                    f"round {round_no}/{args.rounds} {name:<10} {sample.c50.rps:>10,.0f} req/s "
                    f"p99 {sample.c50.p99_ms:.2f} ms, c=1 p50 {sample.c1.p50_ms:.3f} ms",
                    flush=True,
                )
        for proc in processes:
            if proc.popen.poll() is not None:
                raise RuntimeError(f"{proc.name} died during the run:\n{proc.tail()}")
        if args.websocket:
            for proc in targets:
                if proc[2] is not None:  # the HTTP proxies idle while the WebSocket rows run
                    proc[2].stop()
            result.websocket = measure_websocket(args, workdir, processes)
    return result


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds (median reported), default 3")
    parser.add_argument("--duration-s", type=float, default=8, help="each c=50 run, default 8 s")
    parser.add_argument(
        "--latency-duration-s", type=float, default=4, help="each c=1 run, default 4 s"
    )
    parser.add_argument("--connections", type=int, default=50, help="wrk connections, default 50")
    parser.add_argument("--skip-sluice", action="store_true", help="measure direct and nginx only")
    parser.add_argument(
        "--trace-ratio",
        type=float,
        default=None,
        help="also run Sluice with tracing on at this sampling ratio (e.g. 0.01), exporting OTLP",
    )
    parser.add_argument(
        "--baseline-tree",
        type=Path,
        default=None,
        help="also run the gateway from this checkout (e.g. a `git worktree` of main) in the "
        "same rounds, as target 'baseline': before/after in the same conditions",
    )
    parser.add_argument(
        "--h2",
        action="store_true",
        help="also run the HTTP/2 (h2load) and unary gRPC rows against nginx (proxy_h2.py)",
    )
    parser.add_argument("--h2-only", action="store_true", help="run only the HTTP/2 and gRPC rows")
    parser.add_argument(
        "--access-log",
        choices=("text", "json"),
        default=None,
        help="also run Sluice writing an access log in this format to a file, as target 'logged'",
    )
    parser.add_argument(
        "--websocket",
        action="store_true",
        help="also measure WebSocket echo: direct, through nginx, through Sluice",
    )
    parser.add_argument(
        "--ws-connections", type=int, default=10, help="WebSocket sockets, default 10"
    )
    parser.add_argument(
        "--ws-size", type=int, default=128, help="WebSocket message bytes, default 128"
    )
    parser.add_argument(
        "--tls",
        action="store_true",
        help="also measure both proxies terminating TLS: keep-alive req/s and new handshakes/s",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="also measure nginx (worker_processes N) and Sluice (workers: N) on every core",
    )
    parser.add_argument(
        "--limited",
        action="store_true",
        help="with --workers N: also Sluice with a concurrency and a rate limit that never bind "
        "(target limited-wN: the cost of limits shared by the workers)",
    )
    parser.add_argument("--out", type=Path, default=None, help="JSON output file")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.duration_s <= 0 or args.latency_duration_s <= 0:
        parser.error("--rounds must be >= 1 and durations > 0")
    if args.trace_ratio is not None and not 0 <= args.trace_ratio <= 1:
        parser.error("--trace-ratio must be in 0..1")
    if (os.cpu_count() or 1) < 2:
        parser.error("needs 2 cores: the proxy on core 0, upstream and wrk on core 1")
    ensure_tools()
    if args.h2 or args.h2_only:
        if shutil.which("h2load") is None:
            parser.error("--h2 needs h2load (apt-get install nghttp2-client)")
        sys.path.insert(0, str(ROOT))
        from benchmarks import proxy_h2

        with tempfile.TemporaryDirectory(prefix="sluice-bench-h2-") as tmp:
            h2_result = proxy_h2.run(args.rounds, args.duration_s, Path(tmp))
        proxy_h2.print_h2(h2_result)
        if args.h2_only:
            now = dt.datetime.now(dt.UTC)
            out = args.out or Path(tempfile.gettempdir()) / f"proxy-h2-{now:%Y-%m-%dT%H%MZ}.json"
            h2_doc = {"benchmark": "proxy-h2", "date": now.isoformat(timespec="seconds")}
            h2_doc |= {"machine": machine(), **h2_result}
            out.write_text(json.dumps(h2_doc, indent=2) + "\n")
            print(f"\nwrote {out}")
            return 0
    result = run(args)
    table = summarise(result.samples)
    rat = ratios(table)
    print()
    print_table(table, rat)
    now = dt.datetime.now(dt.UTC)
    out = args.out or RESULTS_DIR / f"proxy-{now:%Y-%m-%dT%H%MZ}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    result.machine["loadavg_at_end"] = os.getloadavg()
    document = {
        "benchmark": "proxy",
        "date": now.isoformat(timespec="seconds"),
        "layout": {"proxy_core": PROXY_CORE, "upstream_and_wrk_core": LOAD_CORE},
        **asdict(result),
        "median": table,
        "ratios": rat,
        **({"h2": h2_result} if args.h2 else {}),
        "targets": {
            "rps_sluice_over_nginx": f">= {REQS_TARGET}",
            "c1_added_p50_sluice_over_nginx": f"<= {ADDED_LATENCY_TARGET}",
            "rps_traced_over_sluice": f">= {TRACE_TARGET}",
            "rps_logged_over_sluice": f">= {ACCESS_LOG_TARGET}",
            "rps_sluice_tls_over_nginx_tls": f">= {TLS_TARGET}",
            "rps_sluice_wN_over_nginx_wN": f">= {WORKERS_TARGET}",
        },
    }
    out.write_text(json.dumps(document, indent=2) + "\n")
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
