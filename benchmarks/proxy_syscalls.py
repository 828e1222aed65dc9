"""Where a proxy's kernel time goes: syscalls and wake-up IPIs per proxied request.

    python benchmarks/proxy_syscalls.py                 # nginx and this tree's Sluice
    python benchmarks/proxy_syscalls.py --tree ../main  # another checkout's gateway
    python benchmarks/proxy_syscalls.py --perf-record DIR   # cpu-clock profiles (perf report)

Same layout as ``benchmarks/proxy.py`` (nginx upstream and wrk on core 1, the proxy alone on
core 0, wrk -c50).  While wrk runs against each proxy, ``perf stat`` counts the proxy's
syscalls by kind (tracepoints ``syscalls:sys_enter_*``) and context switches, ``/proc``
gives its user and system CPU, and ``/proc/interrupts`` the rescheduling (RES) and
function-call (CAL) interrupts each core received: on loopback the writer's kernel wakes
the reader, and waking a reader whose core is idle costs the writer an inter-processor
interrupt (in a VM, an exit to the hypervisor).  Everything is divided by the requests wrk
completed.  Needs ``perf`` (Debian: linux-perf) with tracepoints readable
(``perf_event_paranoid`` <= 2 as root).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SYSCALLS = (
    "read",
    "recvfrom",
    "write",
    "writev",
    "sendmsg",
    "epoll_wait",
    "epoll_pwait",
    "epoll_ctl",
    "setsockopt",
    "getsockopt",
    "getsockname",
    "getpeername",
    "accept4",
    "close",
)


def _proxy_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_proxy", ROOT / "benchmarks" / "proxy.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bench = _proxy_bench()


def _group_pids(proc: Any) -> list[str]:
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == proc.popen.pid:
            pids.append(stat.parent.name)
    return pids


def _cpu_s(pids: list[str]) -> tuple[float, float]:
    tick = os.sysconf("SC_CLK_TCK")
    user = system = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        user += int(fields[11])
        system += int(fields[12])
    return user / tick, system / tick


def _ipis() -> dict[str, list[int]]:
    out = {}
    for line in Path("/proc/interrupts").read_text().splitlines():
        parts = line.split()
        if parts and parts[0] in ("RES:", "CAL:"):
            out[parts[0].rstrip(":")] = [int(x) for x in parts[1:3]]
    return out


def profile(name: str, port: int, proc: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Run wrk against ``port`` while counting ``proc``'s syscalls; per-request figures."""
    bench.wrk(port, args.connections, 1, 30)  # warm-up
    pids = _group_pids(proc)
    if args.perf_record is not None:
        argv = ["perf", "record", "-e", "cpu-clock", "-F", "2000", "-g"]
        argv += ["-o", str(args.perf_record / f"{name}.data")]
    else:
        events = ["raw_syscalls:sys_enter", "context-switches"]
        events += [f"syscalls:sys_enter_{s}" for s in SYSCALLS]
        argv = ["perf", "stat", "-x,", "-e", ",".join(events)]
    perf = subprocess.Popen(
        [*argv, "-p", ",".join(pids)], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
    )
    time.sleep(0.3)  # perf attached
    cpu0, ipi0 = _cpu_s(pids), _ipis()
    result = bench.wrk(port, args.connections, args.duration_s, args.duration_s + 30)
    cpu1, ipi1 = _cpu_s(pids), _ipis()
    perf.send_signal(signal.SIGINT)
    _, err = perf.communicate(timeout=60)
    n = result.rps * args.duration_s
    out: dict[str, Any] = {
        "rps": result.rps,
        "user_us": (cpu1[0] - cpu0[0]) / n * 1e6,
        "sys_us": (cpu1[1] - cpu0[1]) / n * 1e6,
        "ipis_to_core": {
            f"{kind} core {core}": (ipi1[kind][core] - ipi0[kind][core]) / n
            for kind in ipi0
            for core in (0, 1)
        },
        "per_request": {},
    }
    for line in err.splitlines():
        parts = line.split(",")
        if len(parts) > 2 and parts[0].strip().isdigit():
            event = (
                parts[2].replace("syscalls:sys_enter_", "").replace("raw_syscalls:sys_enter", "all")
            )
            if int(parts[0]):
                out["per_request"][event] = int(parts[0]) / n
    return out


def _print(name: str, r: dict[str, Any]) -> None:
    print(
        f"{name}: {r['rps']:,.0f} req/s, CPU {r['user_us'] + r['sys_us']:.1f} us/request "
        f"(user {r['user_us']:.1f}, sys {r['sys_us']:.1f})"
    )
    ipis = ", ".join(f"{k} {v:.3f}" for k, v in r["ipis_to_core"].items())
    print(f"  interrupts per request: {ipis}")
    for event, v in sorted(r["per_request"].items(), key=lambda kv: -kv[1]):
        print(f"  {event:<16} {v:7.3f} per request")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, default=ROOT, help="checkout whose gateway runs")
    parser.add_argument("--duration-s", type=float, default=4, help="wrk run, default 4 s")
    parser.add_argument("--connections", type=int, default=50, help="wrk connections, default 50")
    parser.add_argument("--skip-nginx", action="store_true", help="profile Sluice only")
    parser.add_argument(
        "--perf-record", type=Path, default=None, help="record cpu-clock profiles into DIR instead"
    )
    args = parser.parse_args(argv)
    bench.ensure_tools()
    if args.perf_record is not None:
        args.perf_record.mkdir(parents=True, exist_ok=True)
    processes: list[Any] = []
    with tempfile.TemporaryDirectory(prefix="sluice-sys-") as tmp, bench.stopping(processes):
        workdir = Path(tmp)
        upstream, upstream_port = bench.start_upstream(workdir)
        processes.append(upstream)
        nginx_port = bench.free_port()
        if not args.skip_nginx:
            nginx = bench.start_nginx(
                "nginx",
                bench.PROXY_SERVER.format(port=nginx_port, upstream_port=upstream_port),
                bench.PROXY_CORE,
                workdir,
            )
            processes.append(nginx)
            bench.wait_until_serving(nginx, nginx_port)
            _print("nginx", profile("nginx", nginx_port, nginx, args))
        sluice, port = bench.start_gateway("sluice", workdir, upstream_port, cwd=args.tree)
        processes.append(sluice)
        _print("sluice", profile("sluice", port, sluice, args))
    print(
        f"load average {os.getloadavg()[0]:.2f}: other work disturbs the CPU and interrupt "
        "figures (interrupts are counted machine-wide); the syscall counts are the proxy's own"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
