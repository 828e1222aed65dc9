"""Steady CPU-per-request figure for Sluice's data plane (the tool to measure each hot-path change).

    python benchmarks/proxy_harness.py                     # 5 runs x 4 s, median CPU us/request
    python benchmarks/proxy_harness.py --nginx             # also nginx as a proxy, same load
    python benchmarks/proxy_harness.py --py-spy prof.svg   # flame graph of one run (py-spy)
    python benchmarks/proxy_harness.py --callgrind         # user-space instructions/request
    python benchmarks/proxy_harness.py --side-by-side ../main   # this tree vs another, at once
    python benchmarks/proxy_harness.py --side-by-side ../main --tls   # the same over TLS
    python benchmarks/proxy_harness.py --side-by-side ../main --h2 grpc   # unary gRPC (h2load)

``benchmarks/proxy.py`` is the end-to-end comparison (req/s, latency, nginx in the same
run), but on a shared 2-core machine its req/s swing with whatever else runs.  This
harness measures what a hot-path change actually moves: the CPU the gateway spends per
request.  It runs the real gateway (``gateway.app.serve``: data plane, admin plane, scaler
loop, the composition root of ``sluice run``) in this process on uvloop, pinned to core 0,
in front of an nginx upstream on core 1, and drives it with ``wrk -c50`` from core 1.  Per
run it reads this process's user and system CPU (``getrusage``) and the number of
requests the gateway forwarded (its own counter), and reports CPU microseconds per
request: user (Python, uvloop, httptools) and system (socket syscalls) separately.
Medians over ``--runs`` runs; the spread says how much to trust a difference.

``--callgrind`` re-runs the harness under ``valgrind --tool=callgrind`` with collection
switched on only around the load (``callgrind_control``), and reports instructions per
request: deterministic whatever else runs on the machine, user space only (syscalls are
not counted), about 50x slower.  Needs valgrind.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _proxy_bench() -> ModuleType:
    """benchmarks/proxy.py (nginx configs, process control, wrk parsing) as a module."""
    spec = importlib.util.spec_from_file_location("bench_proxy", ROOT / "benchmarks" / "proxy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


bench = _proxy_bench()


@dataclass
class Measurement:
    target: str
    requests: int
    wall_s: float
    user_us_per_request: float
    sys_us_per_request: float

    @property
    def cpu_us_per_request(self) -> float:
        return self.user_us_per_request + self.sys_us_per_request


def _rusage() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime, r.ru_stime


async def _wrk(port: int, connections: int, duration_s: float) -> Any:
    argv = ["taskset", "-c", bench.LOAD_CORE, "wrk", "-t1", f"-c{connections}"]
    argv += [f"-d{duration_s:g}s", "--timeout", "30s", "--latency", "-H", "Host: bench.test"]
    argv.append(f"http://127.0.0.1:{port}/")
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"wrk failed ({proc.returncode}): {err.decode()}")
    result = bench.parse_wrk(out.decode())
    if result.errors or result.non_2xx:
        raise RuntimeError(f"wrk saw {result.errors} errors, {result.non_2xx} non-2xx")
    return result


def _control(action: str) -> None:
    """Switch callgrind's collection on/off for this process (no-op outside valgrind)."""
    if os.environ.get("SLUICE_HARNESS_CALLGRIND"):
        subprocess.run(
            ["callgrind_control", action, str(os.getpid())],
            check=True,
            capture_output=True,
            timeout=120,
        )


async def measure_sluice(args: argparse.Namespace, upstream_port: int) -> list[Measurement]:
    from gateway.app import serve
    from gateway.runtime import Runtime
    from gateway.settings import load_settings

    dp_port = bench.free_port()
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
        f.write(
            bench.SLUICE_CONFIG.format(
                port=dp_port, admin_port=bench.free_port(), upstream_port=upstream_port
            )
        )
        if args.access_log is not None:
            log_path = Path(tempfile.gettempdir()) / f"sluice-harness-access-{os.getpid()}.log"
            f.write(f"access_log: {{enabled: true, format: {args.access_log}, path: {log_path}}}\n")
        config = Path(f.name)
    try:
        settings = load_settings(config)
    finally:
        config.unlink()
    stop = asyncio.Event()
    results: list[Measurement] = []

    async def drive(runtime: Runtime) -> None:
        try:
            counter = runtime.services["bench"].stats
            await _wrk(dp_port, args.connections, 1.0)  # warm-up: pools, caches
            for _ in range(args.runs):
                n_counted: int | None = None
                before_n = counter.arrivals_total
                u0, s0 = _rusage()
                t0 = time.monotonic()
                if os.environ.get("SLUICE_HARNESS_CALLGRIND"):
                    # Count only the steady middle of the run: wrk's connections opening
                    # and closing (accept, connection_made/lost in the loop's callbacks)
                    # would otherwise weigh on the few thousand requests valgrind allows.
                    load = asyncio.ensure_future(_wrk(dp_port, args.connections, args.duration_s))
                    await asyncio.sleep(args.duration_s * 0.25)
                    before_n = counter.arrivals_total
                    _control("--instr=on")
                    await asyncio.sleep(args.duration_s * 0.5)
                    _control("--instr=off")
                    n_counted = counter.arrivals_total - before_n
                    await load
                else:
                    await _wrk(dp_port, args.connections, args.duration_s)
                u1, s1 = _rusage()
                n = counter.arrivals_total - before_n if n_counted is None else n_counted
                m = Measurement(
                    "sluice", n, time.monotonic() - t0, (u1 - u0) / n * 1e6, (s1 - s0) / n * 1e6
                )
                results.append(m)
                print(
                    f"sluice {n:>8} req  cpu {m.cpu_us_per_request:6.1f} us/req "
                    f"(user {m.user_us_per_request:5.1f}, sys {m.sys_us_per_request:5.1f})  "
                    f"load {os.getloadavg()[0]:.2f}",
                    flush=True,
                )
        finally:
            stop.set()

    await serve(settings, stop=stop, on_ready=drive)
    return results


def measure_nginx(args: argparse.Namespace, upstream_port: int, workdir: Path) -> list[Measurement]:
    port = bench.free_port()
    nginx = bench.start_nginx(
        "nginx",
        bench.PROXY_SERVER.format(port=port, upstream_port=upstream_port),
        bench.PROXY_CORE,
        workdir,
    )
    results = []
    try:
        bench.wait_until_serving(nginx, port)
        bench.wrk(port, args.connections, 1, 30)
        for _ in range(args.runs):
            c0 = nginx.group_cpu_s()
            r = bench.wrk(port, args.connections, args.duration_s, args.duration_s + 30)
            cpu = nginx.group_cpu_s() - c0
            m = Measurement("nginx", r.requests, r.duration_s, cpu / r.requests * 1e6, 0.0)
            results.append(m)
            print(f"nginx  {r.requests:>8} req  cpu {m.cpu_us_per_request:6.1f} us/req", flush=True)
    finally:
        nginx.stop()
    return results


def _summary(ms: list[Measurement]) -> dict[str, float]:
    cpu = [m.cpu_us_per_request for m in ms]
    return {
        "runs": len(ms),
        "cpu_us_per_request_median": statistics.median(cpu),
        "cpu_us_per_request_min": min(cpu),
        "cpu_us_per_request_max": max(cpu),
        "user_us_per_request_median": statistics.median(m.user_us_per_request for m in ms),
        "sys_us_per_request_median": statistics.median(m.sys_us_per_request for m in ms),
        "rps_median": statistics.median(m.requests / m.wall_s for m in ms),
        "requests": sum(m.requests for m in ms),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    import uvloop

    bench.ensure_tools()
    with tempfile.TemporaryDirectory(prefix="sluice-harness-") as tmp:
        workdir = Path(tmp)
        upstream, upstream_port = bench.start_upstream(workdir)
        try:
            out: dict[str, Any] = {"loadavg_at_start": os.getloadavg()}
            if args.nginx:
                out["nginx"] = _summary(measure_nginx(args, upstream_port, workdir))
            os.sched_setaffinity(0, {int(bench.PROXY_CORE)})
            ms = uvloop.run(measure_sluice(args, upstream_port))
            out["sluice"] = _summary(ms)
            out["loadavg_at_end"] = os.getloadavg()
        finally:
            upstream.stop()
    return out


# ---------------------------------------------------------------- --side-by-side TREE


def side_by_side(args: argparse.Namespace) -> int:
    """This tree's gateway and ``TREE``'s, both on core 0, each under its own wrk -c50 at
    the same time: whatever else runs on the machine disturbs both alike, so the CPU per
    request of the two is comparable even when neither figure is steady on its own."""
    bench.ensure_tools()
    if args.h2 is not None:
        return side_by_side_h2(args)
    trees = {"this": ROOT, "other": args.side_by_side.resolve()}
    processes: list[Any] = []
    with tempfile.TemporaryDirectory(prefix="sluice-sbs-") as tmp, bench.stopping(processes):
        workdir = Path(tmp)
        upstream, upstream_port = bench.start_upstream(workdir)
        processes.append(upstream)
        gateways = {}
        tls = bench.make_certificate(workdir) if args.tls else None
        for name, tree in trees.items():
            extra = "workers: 1\n"
            tls_port = bench.free_port()
            if tls is not None:
                extra += bench.SLUICE_TLS.format(tls_port=tls_port, cert=tls[0], key=tls[1])
            proc, port = bench.start_gateway(
                name, workdir, upstream_port, cwd=tree, extra_config=extra
            )
            processes.append(proc)
            if tls is not None:
                port = tls_port
            bench.wrk(port, args.connections, 1, 30, _scheme(args))  # warm-up
            gateways[name] = (port, proc)
        ratios = []
        for n in range(1, args.runs + 1):
            done: dict[str, Any] = {}
            cpu0 = {name: proc.group_cpu_s() for name, (_, proc) in gateways.items()}

            threads = [
                threading.Thread(target=_load, args=(args, name, port, done))
                for name, (port, _) in gateways.items()
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            per = {
                name: (proc.group_cpu_s() - cpu0[name]) / done[name].requests * 1e6
                for name, (_, proc) in gateways.items()
            }
            ratios.append(per["this"] / per["other"])
            print(
                f"run {n}: this {per['this']:.1f} us/req ({done['this'].rps:,.0f} req/s), "
                f"other {per['other']:.1f} us/req ({done['other'].rps:,.0f} req/s), "
                f"this/other {ratios[-1]:.3f}, load {os.getloadavg()[0]:.2f}",
                flush=True,
            )
    print(f"\nCPU per request, this tree / {trees['other']}: {statistics.median(ratios):.3f}")
    return 0


def side_by_side_h2(args: argparse.Namespace) -> int:
    """``--side-by-side TREE --h2 h2|grpc``: the same over HTTP/2 (``benchmarks/proxy_h2.py``'s
    load: h2load, 8 connections x 10 streams): ``h2``: GET through ``listen.h2c`` to the
    HTTP/1.1 nginx upstream; ``grpc``: unary gRPC calls to a grpcio server (``protocol: h2c``)."""
    from benchmarks import proxy_h2

    trees = {"this": ROOT, "other": args.side_by_side.resolve()}
    grpc = args.h2 == "grpc"
    path = "/test.Echo/Unary" if grpc else "/"
    processes: list[Any] = []
    with tempfile.TemporaryDirectory(prefix="sluice-sbs-h2-") as tmp, bench.stopping(processes):
        workdir = Path(tmp)
        if grpc:
            upstream, upstream_port = proxy_h2.start_grpc_upstream(workdir)
        else:
            upstream, upstream_port = bench.start_upstream(workdir)
        processes.append(upstream)
        gateways = {}
        for name, tree in trees.items():
            proc, port = proxy_h2.start_sluice(
                workdir, name, upstream_port, "h2c" if grpc else "http1", cwd=tree
            )
            processes.append(proc)
            (workdir / name).mkdir()
            proxy_h2.h2load(port, path, 1, workdir / name, grpc)  # warm-up
            gateways[name] = (port, proc)
        ratios = []
        for n in range(1, args.runs + 1):
            done: dict[str, tuple[float, float]] = {}
            threads = [
                threading.Thread(
                    target=_load_h2,
                    args=(proc, port, path, args.duration_s, workdir / name, grpc, done, name),
                )
                for name, (port, proc) in gateways.items()
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            ratios.append(done["this"][0] / done["other"][0])
            print(
                f"run {n}: this {done['this'][0]:.1f} us/req ({done['this'][1]:,.0f} req/s), "
                f"other {done['other'][0]:.1f} us/req ({done['other'][1]:,.0f} req/s), "
                f"this/other {ratios[-1]:.3f}, load {os.getloadavg()[0]:.2f}",
                flush=True,
            )
    print(
        f"\n{args.h2} CPU per request, this tree / {trees['other']}: "
        f"{statistics.median(ratios):.3f}"
    )
    return 0


def _load_h2(
    proc: Any,
    port: int,
    path: str,
    duration_s: float,
    workdir: Path,
    grpc: bool,
    done: dict[str, tuple[float, float]],
    name: str,
) -> None:
    """h2load against one gateway: ``done[name]`` = (CPU us per request, req/s)."""
    from benchmarks import proxy_h2

    cpu0, t0 = proc.group_cpu_s(), time.monotonic()
    rps = proxy_h2.h2load(port, path, duration_s, workdir, grpc)[0]
    requests = rps * (time.monotonic() - t0)
    done[name] = ((proc.group_cpu_s() - cpu0) / requests * 1e6, rps)


def _scheme(args: argparse.Namespace) -> str:
    return "https" if args.tls else "http"


def _load(args: argparse.Namespace, name: str, port: int, done: dict[str, Any]) -> None:
    timeout_s = args.duration_s + 30
    if not args.browser_head:
        done[name] = bench.wrk(port, args.connections, args.duration_s, timeout_s, _scheme(args))
        return
    argv = ["taskset", "-c", bench.LOAD_CORE, "wrk", "-t1", f"-c{args.connections}"]
    argv += [f"-d{args.duration_s:g}s", "--latency", "-H", "Host: bench.test"]
    for field_name, value in BROWSER_HEADERS:
        argv += ["-H", f"{field_name.decode()}: {value.decode()}"]
    argv.append(f"http://127.0.0.1:{port}/")
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=timeout_s)
    done[name] = bench.parse_wrk(out.stdout)


# ---------------------------------------------------------------- --micro: no sockets

MICRO_REQUEST = b"GET / HTTP/1.1\r\nHost: bench.test\r\nUser-Agent: wrk\r\n\r\n"
BROWSER_HEADERS = (
    (b"User-Agent", b"Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0"),
    (b"Accept", b"text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"),
    (b"Accept-Language", b"en-US,en;q=0.5"),
    (b"Accept-Encoding", b"gzip, deflate, br, zstd"),
    (b"Connection", b"keep-alive"),
    (b"Cookie", b"session=4f9a1c2e8b7d6a5f3e2d1c0b9a8f7e6d; theme=dark"),
    (b"Upgrade-Insecure-Requests", b"1"),
    (b"Sec-Fetch-Dest", b"document"),
    (b"Sec-Fetch-Mode", b"navigate"),
    (b"Sec-Fetch-Site", b"none"),
    (b"Priority", b"u=0, i"),
)
"""A browser-like request's fields after Host (``--browser-head``: 12 fields in all)."""
BROWSER_REQUEST = (
    b"GET / HTTP/1.1\r\nHost: bench.test\r\n"
    + b"".join(b"%s: %s\r\n" % field for field in BROWSER_HEADERS)
    + b"\r\n"
)
MICRO_RESPONSE = (
    b"HTTP/1.1 200 OK\r\nServer: nginx/1.22.1\r\nDate: Thu, 01 Jan 2026 00:00:00 GMT\r\n"
    b"Content-Type: text/plain\r\nContent-Length: 3\r\nConnection: keep-alive\r\n\r\nok\n"
)


MICRO_ROUND = 16
"""Requests per event-loop round in ``--micro`` (the outbox sends once per round): about what
one round handles at wrk -c50 (~32 held writes per round measured, two per request)."""


class MemoryTransport:
    """An in-memory transport: counts what is written, never blocks (``--micro`` only)."""

    def __init__(self, peer: tuple[str, int]) -> None:
        self.peer = peer
        self.written = 0
        self.closing = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.peer if name == "peername" else default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def writelines(self, chunks: Any) -> None:
        for chunk in chunks:
            self.written += len(chunk)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True


async def micro(
    requests: int, runs: int, check: bool = True, request: bytes = MICRO_REQUEST
) -> list[float]:
    """The data plane's Python path per request, socket I/O replaced by memory transports.

    One client connection and one pooled upstream connection; each request is fed to the
    client side, its response to the upstream side, as the event loop would.  Returns the
    CPU microseconds per request of each run.
    """
    from gateway.dataplane.server import ClientConnection, DataPlane
    from gateway.dataplane.updates import endpoints_from_settings, routes_from_settings
    from gateway.dataplane.upstream import EndpointConnections, UpstreamConnection
    from gateway.runtime import Runtime
    from gateway.settings import Settings

    settings = Settings.model_validate(
        {
            "services": {
                "bench": {
                    "routes": [{"path": "/", "path_type": "Prefix"}],
                    "endpoints": ["127.0.0.1:9"],
                }
            }
        }
    )
    runtime = Runtime(settings)
    runtime.apply_routes(routes_from_settings(settings))
    for update in endpoints_from_settings(settings):
        runtime.apply_endpoints(update)
    dp = DataPlane(runtime)
    ep = runtime.services["bench"].endpoints.routable[0]
    pool = ep.pool = EndpointConnections(ep.host, ep.port, ep.address)
    up = UpstreamConnection(pool)
    up.connection_made(MemoryTransport(("127.0.0.1", 9)))  # type: ignore[arg-type]
    pool.put(up, dp.loop.time())
    client = ClientConnection(dp)
    client.connection_made(MemoryTransport(("127.0.0.1", 40000)))  # type: ignore[arg-type]
    outbox = dp.outbox
    outbox.holding = True  # as at c=50 (a round has many writes)
    out = []
    for _ in range(runs):
        _control("--instr=on")
        t0 = time.process_time()
        for i in range(requests):
            client.data_received(request)
            up.data_received(MICRO_RESPONSE)
            if i % MICRO_ROUND == 0:
                outbox.flush()  # what the loop does at the end of each round
        outbox.flush()
        out.append((time.process_time() - t0) / requests * 1e6)
        _control("--instr=off")
        await asyncio.sleep(0)  # the outbox's scheduled rounds (nothing left to send)
    if check and runtime.services["bench"].stats.codes != {200: requests * runs}:
        raise RuntimeError(f"unexpected outcomes: {runtime.services['bench'].stats.codes}")
    return out


def run_callgrind(args: argparse.Namespace) -> int:
    """Re-run this script under callgrind; report instructions per forwarded request.

    With ``--micro N``: the memory-transport loop (everything in it is per request);
    else the socket run, counted only inside socket callbacks (``uv__stream_io``): the
    per-request path without timers and the scaler's ticks.
    """
    if not shutil.which("valgrind"):
        raise SystemExit("--callgrind needs valgrind")
    with tempfile.TemporaryDirectory(prefix="sluice-callgrind-") as tmp:
        out = Path(tmp) / "callgrind.out"
        report = Path(tmp) / "report.json"
        argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no"]
        if not args.micro:
            # socket callbacks, and the loop's ready callbacks (the outbox's sends run there)
            argv += ["--toggle-collect=uv__stream_io", "--toggle-collect=uv__run_idle"]
        argv += [f"--callgrind-out-file={out}", sys.executable, __file__]
        argv += ["--runs", "1", "--duration-s", str(args.duration_s), "--json", str(report)]
        argv += ["--connections", str(args.connections), "--micro", str(args.micro)]
        if args.browser_head:
            argv.append("--browser-head")
        env = {**os.environ, "SLUICE_HARNESS_CALLGRIND": "1"}
        done = subprocess.run(argv, check=False, env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"valgrind run failed:\n{done.stderr[-3000:]}")
        requests = json.loads(report.read_text())["sluice"]["requests"]
        total = 0
        for line in out.read_text().splitlines():
            if line.startswith("totals:") or line.startswith("summary:"):
                total = int(line.split()[1])
        print(f"callgrind: {total / requests:,.0f} instructions per request ({requests} requests)")
        if args.callgrind_keep:
            shutil.copy(out, args.callgrind_keep)
            print(f"kept {args.callgrind_keep} (callgrind_annotate it)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="measured runs, default 5")
    parser.add_argument("--duration-s", type=float, default=4, help="each run, default 4 s")
    parser.add_argument("--connections", type=int, default=50, help="wrk connections, default 50")
    parser.add_argument("--nginx", action="store_true", help="also measure nginx as the proxy")
    parser.add_argument(
        "--browser-head",
        action="store_true",
        help="--micro, --side-by-side: a 12-field browser-like request head instead of wrk's",
    )
    parser.add_argument("--callgrind", action="store_true", help="instructions/request (valgrind)")
    parser.add_argument("--callgrind-keep", type=Path, default=None, help="keep the callgrind file")
    parser.add_argument(
        "--micro", type=int, default=0, help="N requests through memory transports (no sockets)"
    )
    parser.add_argument(
        "--side-by-side",
        type=Path,
        default=None,
        metavar="TREE",
        help="run this tree's gateway and TREE's at once, each under its own wrk; compare",
    )
    parser.add_argument("--py-spy", type=Path, default=None, help="record a py-spy flame graph")
    parser.add_argument(
        "--access-log",
        choices=("text", "json"),
        default=None,
        help="the gateway writes an access log in this format (to a file in the temp directory)",
    )
    parser.add_argument(
        "--tls",
        action="store_true",
        help="with --side-by-side: both gateways terminate TLS (wrk over https, keep-alive)",
    )
    parser.add_argument(
        "--h2",
        choices=("h2", "grpc"),
        default=None,
        help="with --side-by-side: HTTP/2 load by h2load instead (h2c GET, or unary gRPC)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the summary as JSON")
    args = parser.parse_args(argv)
    if args.runs < 1 or args.duration_s <= 0:
        parser.error("--runs must be >= 1 and --duration-s > 0")
    if args.callgrind:
        return run_callgrind(args)
    if args.side_by_side is not None:
        return side_by_side(args)
    if args.micro:
        import uvloop

        per = uvloop.run(
            micro(
                args.micro,
                args.runs,
                request=BROWSER_REQUEST if args.browser_head else MICRO_REQUEST,
            )
        )
        if args.json is not None:
            summary = {"cpu_us_per_request": per, "requests": args.micro * args.runs}
            args.json.write_text(json.dumps({"sluice": summary}) + "\n")
        print(
            f"micro: {statistics.median(per):.2f} us CPU per request (median of {len(per)}, "
            f"min {min(per):.2f}): the Python path without sockets"
        )
        return 0
    spy = None
    if args.py_spy is not None:
        spy = subprocess.Popen(
            ["py-spy", "record", "--nonblocking", "-r", "250", "-o", str(args.py_spy)]
            + (["-f", "raw"] if args.py_spy.suffix == ".txt" else [])
            + ["--pid", str(os.getpid())],
            stdout=subprocess.DEVNULL,
        )
    try:
        out = run(args)
    finally:
        if spy is not None:
            spy.send_signal(2)
            spy.wait(timeout=60)
    s = out["sluice"]
    print(
        f"\nsluice: {s['cpu_us_per_request_median']:.1f} us CPU per request (median of "
        f"{s['runs']}; min {s['cpu_us_per_request_min']:.1f}, max "
        f"{s['cpu_us_per_request_max']:.1f}; user {s['user_us_per_request_median']:.1f}, "
        f"sys {s['sys_us_per_request_median']:.1f})"
    )
    if "nginx" in out:
        n = out["nginx"]["cpu_us_per_request_median"]
        print(
            f"nginx:  {n:.1f} us CPU per request; Sluice/nginx "
            f"{s['cpu_us_per_request_median'] / n:.2f}"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
