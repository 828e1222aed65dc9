"""What tracing costs the real proxy: req/s with tracing off vs on at a sampling ratio.

    python benchmarks/tracing_proxy.py                       # 3 rounds x 8 s per setting
    python benchmarks/tracing_proxy.py --rounds 1 --duration-s 3   # quick look

Setup (all on 127.0.0.1, free ports, everything stopped at the end): an nginx upstream
answering ``GET /`` with 3 bytes; ``python -m gateway run`` pinned alone to core 0
(``taskset -c 0``); ``wrk -t1 -c50`` and the upstream on core 1.  Settings, alternated
within each round so drift hits them alike:

* ``off``: no ``telemetry`` section (tracing disabled: one branch per request);
* ``ratio=R`` for each ``--ratio`` (default 0.01): tracing on, ``parentbased_ratio`` R,
  exporting over OTLP/HTTP (``OTEL_BSP_SCHEDULE_DELAY`` default) to a real receiver in this
  process (which decodes every batch, on core 1); ``--exporter none`` keeps spans in the
  in-memory buffer only (what the exporter itself costs is the difference).

Reports median req/s, the gateway's CPU microseconds per request (from /proc) and the
ratio to ``off``.  The issue's target: ratio=0.01 keeps >= 0.95 of ``off``'s req/s.  Writes
``benchmarks/results/tracing-proxy-<UTC>.json`` with the machine description.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.otlp_receiver import otlp_receiver  # noqa: E402

PROXY_CORE, LOAD_CORE = "0", "1"
NGINX = """\
worker_processes 1;
pid {dir}/up.pid;
error_log {dir}/up.error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {dir}/b; proxy_temp_path {dir}/p; fastcgi_temp_path {dir}/f;
  uwsgi_temp_path {dir}/u; scgi_temp_path {dir}/s;
  keepalive_requests 1000000;
  server {{ listen 127.0.0.1:{port}; location / {{ default_type text/plain; return 200 "ok\\n"; }} }}
}}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_serving(port: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def wrk(port: int, duration_s: float, connections: int) -> float:
    argv = ["taskset", "-c", LOAD_CORE, "wrk", "-t1", f"-c{connections}", f"-d{duration_s:g}s"]
    out = subprocess.run(
        [*argv, f"http://127.0.0.1:{port}/"],
        capture_output=True,
        text=True,
        check=True,
        timeout=duration_s + 30,
    ).stdout
    m = re.search(r"Requests/sec:\s+([\d.]+)", out)
    if m is None:
        raise RuntimeError(f"cannot parse wrk output:\n{out}")
    if "Non-2xx" in out or "Socket errors" in out:
        raise RuntimeError(f"errors during the run:\n{out}")
    return float(m.group(1))


def gateway_config(
    workdir: Path, name: str, upstream_port: int, ratio: float | None, endpoint: str
) -> tuple[Path, int]:
    port = free_port()
    config: dict[str, Any] = {
        "listen": {"host": "127.0.0.1", "port": port},
        "admin": {"host": "127.0.0.1", "port": 0},
        "services": {
            "bench": {"routes": [{"path": "/"}], "endpoints": [f"127.0.0.1:{upstream_port}"]}
        },
    }
    if ratio is not None:
        config["telemetry"] = {
            "traces": {
                "enabled": True,
                "sampler": {"type": "parentbased_ratio", "ratio": ratio},
                "exporter": "otlp_http" if endpoint else "none",
                **({"endpoint": endpoint} if endpoint else {}),
            }
        }
    path = workdir / f"{name}.yaml"
    path.write_text(json.dumps(config))  # JSON is YAML
    return path, port


def measure(config: Path, port: int, args: argparse.Namespace) -> dict[str, float]:
    proc = subprocess.Popen(
        [
            "taskset",
            "-c",
            PROXY_CORE,
            sys.executable,
            "-m",
            "gateway",
            "run",
            "--config",
            str(config),
        ],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_serving(port)
        wrk(port, 1.0, args.connections)  # warm up: pools, caches
        before = cpu_s(proc.pid)
        rps = wrk(port, args.duration_s, args.connections)
        used = cpu_s(proc.pid) - before
        return {"rps": rps, "cpu_us_per_request": used / (rps * args.duration_s) * 1e6}
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds, medians reported (default 3)"
    )
    parser.add_argument("--duration-s", type=float, default=8.0, help="each wrk run (default 8 s)")
    parser.add_argument("--connections", type=int, default=50, help="wrk connections (default 50)")
    parser.add_argument(
        "--ratio", type=float, action="append", help="sampling ratio(s) (default 0.01)"
    )
    parser.add_argument(
        "--exporter",
        choices=["otlp_http", "none"],
        default="otlp_http",
        help="otlp_http (to the in-process receiver, default) or none (in-memory buffer only)",
    )
    parser.add_argument("--out", type=Path, default=None, help="JSON output file")
    args = parser.parse_args(argv)
    ratios: list[float] = args.ratio or [0.01]
    for tool in ("wrk", "taskset"):
        if shutil.which(tool) is None:
            raise SystemExit(f"needs {tool} (apt-get install wrk util-linux)")
    nginx = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/sbin")
    if nginx is None:
        raise SystemExit("needs nginx (apt-get install nginx-light)")
    settings: list[tuple[str, float | None]] = [("off", None)] + [
        (f"ratio={r:g}", r) for r in ratios
    ]
    samples: dict[str, list[dict[str, float]]] = {name: [] for name, _ in settings}
    with tempfile.TemporaryDirectory() as tmp, otlp_receiver() as receiver:
        workdir = Path(tmp)
        up_port = free_port()
        (workdir / "up.conf").write_text(NGINX.format(dir=workdir, port=up_port))
        upstream = subprocess.Popen(
            [
                "taskset",
                "-c",
                LOAD_CORE,
                nginx,
                "-p",
                str(workdir),
                "-e",
                str(workdir / "up.error.log"),
                "-c",
                str(workdir / "up.conf"),
                "-g",
                "daemon off; master_process on;",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_serving(up_port)
            for r in range(args.rounds):
                for name, ratio in settings:
                    endpoint = receiver.endpoint if args.exporter == "otlp_http" else None
                    config, port = gateway_config(workdir, name, up_port, ratio, endpoint)
                    sample = measure(config, port, args)
                    samples[name].append(sample)
                    print(
                        f"round {r + 1}: {name:<12} {sample['rps']:>9.0f} req/s  "
                        f"{sample['cpu_us_per_request']:.1f} µs CPU/request",
                        flush=True,
                    )
        finally:
            upstream.send_signal(signal.SIGQUIT)
            upstream.wait(10)
        exported = len(receiver.spans())
    table = {
        name: {
            "rps": statistics.median(s["rps"] for s in rows),
            "cpu_us_per_request": statistics.median(s["cpu_us_per_request"] for s in rows),
        }
        for name, rows in samples.items()
    }
    base = table["off"]["rps"]
    print(f"\n{'setting':<12} {'req/s':>9} {'µs CPU/req':>11} {'vs off':>7}")
    for name, row in table.items():
        print(
            f"{name:<12} {row['rps']:>9.0f} {row['cpu_us_per_request']:>11.1f} {row['rps'] / base:>7.3f}"
        )
    print(f"(spans received by the OTLP receiver: {exported})")
    result = {
        "table": table,
        "ratios_vs_off": {name: row["rps"] / base for name, row in table.items()},
        "samples": samples,
        "spans_exported": exported,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "loadavg": os.getloadavg(),
        },
    }
    out = (
        args.out
        or ROOT
        / "benchmarks"
        / "results"
        / f"tracing-proxy-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%SZ}.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
