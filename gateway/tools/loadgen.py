"""``sluice load``: a bounded open-loop load generator for the demo (loopback only).

Open loop: requests are sent on a fixed schedule whatever the answers take, so a slow
service builds a queue instead of slowing the generator down (what real clients do).  The
schedule comes from the config: a service that always keeps a replica (``min_replicas >=
1``, e.g. ``api``) gets a **steady** rate; a service that may scale to zero (e.g.
``reports``) gets **periodic bursts** (``burst_rps`` for ``burst_s`` every ``period_s``).

Bounded: at most ``max_requests`` requests and ``max_in_flight`` at once (a send that
would exceed it is counted as ``skipped``, not queued), ``duration_s`` of sending, then at
most ``timeout_s`` to collect the answers.  Only 127.0.0.1 / ::1 / localhost targets.

The client is a small keep-alive HTTP/1.1 pool on asyncio streams with httptools (cheap, so
the generator leaves the CPU to the replicas it loads).  :func:`run_load` is also the
library the live benchmark uses.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httptools

from gateway.settings import Settings
from gateway.tools.address import address_argument

LOOPBACK = frozenset({"127.0.0.1", "::1", "localhost"})


@dataclass(frozen=True, slots=True)
class Stream:
    """One service's arrivals: steady ``rps``, or bursts of ``rps`` for ``burst_s`` every
    ``period_s`` (starting ``offset_s`` after the start) when ``period_s`` is set."""

    service: str
    path: str
    host: str | None = None
    rps: float = 10.0
    burst_s: float | None = None
    period_s: float | None = None
    offset_s: float = 0.0
    concurrency: int | None = None
    """Closed loop instead: this many clients, each sending its next request as soon as the
    previous one is answered (a throughput job: it takes whatever capacity it gets)."""

    def send_times(self, duration_s: float) -> list[float]:
        """Offsets (s) of every send within ``duration_s``: evenly spaced, deterministic."""
        if self.rps <= 0 or self.concurrency is not None:
            return []
        gap = 1.0 / self.rps
        if self.period_s is None or self.burst_s is None:
            return [i * gap for i in range(math.ceil(duration_s * self.rps - 1e-9))]
        out = []
        start = self.offset_s
        while start < duration_s:
            end = min(start + self.burst_s, duration_s)
            t = start
            while t < end - 1e-9:
                out.append(t)
                t += gap
            start += self.period_s
        return out

    def describe(self) -> str:
        where = f"{self.host or ''}{self.path}"
        if self.concurrency is not None:
            return f"{self.service}: closed loop, {self.concurrency} clients on {where}"
        if self.period_s is None:
            return f"{self.service}: steady {self.rps:g} rps on {where}"
        return (
            f"{self.service}: bursts of {self.rps:g} rps for {self.burst_s:g}s every "
            f"{self.period_s:g}s (first at {self.offset_s:g}s) on {where}"
        )


@dataclass(slots=True)
class Result:
    service: str
    sent_at_s: float
    """Offset from the start of the run."""
    latency_s: float
    status: int
    """HTTP status; 0 = no answer (connection failed, reset or timed out)."""
    error: str = ""
    """The Sluice-Error header, or the client-side failure."""


@dataclass(slots=True)
class LoadReport:
    duration_s: float
    results: list[Result] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)
    """Sends not made because ``max_in_flight`` requests were already waiting."""

    def services(self) -> list[str]:
        return sorted({r.service for r in self.results} | set(self.skipped))

    def summary(self, service: str) -> dict[str, Any]:
        rs = [r for r in self.results if r.service == service]
        ok = sorted(r.latency_s for r in rs if 200 <= r.status < 300)
        statuses = Counter("none" if r.status == 0 else str(r.status) for r in rs)
        return {
            "requests": len(rs),
            "statuses": dict(sorted(statuses.items())),
            "ok": len(ok),
            "lost": len(rs) - len(ok),
            "skipped": self.skipped.get(service, 0),
            "p50_s": percentile(ok, 0.50),
            "p99_s": percentile(ok, 0.99),
            "ok_per_s": len(ok) / self.duration_s if self.duration_s > 0 else 0.0,
        }


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Nearest-rank percentile of an already sorted list (None when empty)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


# -- the client ------------------------------------------------------------------------------


class _Response:
    def __init__(self) -> None:
        self.headers: dict[bytes, bytes] = {}
        self.done = False

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers[name.lower()] = value

    def on_message_complete(self) -> None:
        self.done = True


class Client:
    """Keep-alive HTTP/1.1 GETs to one loopback address (idle connections reused)."""

    def __init__(self, host: str, port: int) -> None:
        if host not in LOOPBACK:
            raise ValueError(f"sluice load only sends to 127.0.0.1, ::1 or localhost, not {host!r}")
        self.host = host
        self.port = port
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def get(self, path: str, host_header: str | None) -> tuple[int, str]:
        """``(status, Sluice-Error or '')``; raises OSError / EOFError on a broken connection."""
        if self._idle:
            reader, writer = self._idle.pop()
        else:
            reader, writer = await asyncio.open_connection(self.host, self.port)
        try:
            authority = host_header or f"{self.host}:{self.port}"
            writer.write(f"GET {path} HTTP/1.1\r\nHost: {authority}\r\n\r\n".encode("latin-1"))
            response = _Response()
            parser = httptools.HttpResponseParser(response)
            while not response.done:
                data = await reader.read(65536)
                if not data:
                    raise EOFError("the connection closed before the response ended")
                parser.feed_data(data)
            status = parser.get_status_code()
            error = response.headers.get(b"sluice-error", b"").decode("latin-1")
        except BaseException:
            writer.close()
            raise
        if parser.should_keep_alive():
            self._idle.append((reader, writer))
        else:
            writer.close()
        return status, error

    def close(self) -> None:
        for _, writer in self._idle:
            writer.close()
        self._idle.clear()


# -- the run ----------------------------------------------------------------------------------


async def run_load(
    streams: list[Stream],
    host: str,
    port: int,
    duration_s: float,
    *,
    max_requests: int = 200_000,
    max_in_flight: int = 2_000,
    timeout_s: float = 60.0,
    query: str = "",
    progress: Callable[[LoadReport, float], None] | None = None,
    progress_every_s: float = 5.0,
) -> LoadReport:
    """Send every stream's schedule for ``duration_s``; wait up to ``timeout_s`` for answers.

    ``progress(report, elapsed_s)`` is called every ``progress_every_s`` while sending."""
    if duration_s <= 0:
        raise ValueError(f"duration_s must be > 0, got {duration_s!r}")
    schedule = sorted((t, i) for i, s in enumerate(streams) for t in s.send_times(duration_s))[
        :max_requests
    ]
    client = Client(host, port)
    loop = asyncio.get_running_loop()
    report = LoadReport(duration_s=duration_s)
    tasks: set[asyncio.Task[None]] = set()
    start = loop.time()

    async def one(stream: Stream, sent_at: float) -> None:
        path = stream.path + (("&" if "?" in stream.path else "?") + query if query else "")
        t0 = loop.time()
        try:
            status, error = await asyncio.wait_for(client.get(path, stream.host), timeout_s)
        except (OSError, EOFError, httptools.HttpParserError, TimeoutError) as e:
            status, error = 0, type(e).__name__
        report.results.append(Result(stream.service, sent_at, loop.time() - t0, status, error))

    async def closed(stream: Stream) -> None:
        while loop.time() < start + duration_s and len(report.results) < max_requests:
            await one(stream, loop.time() - start)

    async def report_progress(callback: Callable[[LoadReport, float], None]) -> None:
        while True:
            await asyncio.sleep(progress_every_s)
            callback(report, loop.time() - start)

    reporter = None if progress is None else loop.create_task(report_progress(progress))
    workers = [
        loop.create_task(closed(s))
        for s in streams
        if s.concurrency is not None
        for _ in range(s.concurrency)
    ]
    for offset, i in schedule:
        delay = start + offset - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        stream = streams[i]
        if len(tasks) >= max_in_flight:
            report.skipped[stream.service] += 1
            continue
        task = loop.create_task(one(stream, offset))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    pending = tasks | set(workers)
    if pending:
        await asyncio.wait(pending, timeout=max(0.0, start + duration_s - loop.time()) + timeout_s)
    tasks.update(w for w in workers if not w.done())
    if reporter is not None:
        tasks.add(reporter)
    for task in list(tasks):
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    client.close()
    return report


def streams_from_settings(
    settings: Settings,
    *,
    rps: float,
    burst_rps: float,
    burst_s: float,
    period_s: float,
    first_burst_s: float,
) -> list[Stream]:
    """Steady load on services that keep a replica, periodic bursts on those that may scale
    to zero; each aimed at its first route (host and path)."""
    streams = []
    for name, service in settings.services.items():
        if not service.routes:
            continue
        route = service.routes[0]
        host = route.host if route.host and not route.host.startswith("*") else None
        path = route.path.rstrip("/") + "/load"
        if service.scaling.min_replicas >= 1:
            streams.append(Stream(name, path, host, rps=rps))
        else:
            streams.append(
                Stream(
                    name,
                    path,
                    host,
                    rps=burst_rps,
                    burst_s=burst_s,
                    period_s=period_s,
                    offset_s=first_burst_s,
                )
            )
    return streams


def _target(settings: Settings) -> tuple[str, int]:
    host = settings.listen.host
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return host, settings.listen.port


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f} ms"


def format_report(report: LoadReport) -> str:
    lines = [
        f"{'service':<12} {'requests':>8} {'ok':>7} {'lost':>5} {'skipped':>7} "
        f"{'ok/s':>6} {'p50':>8} {'p99':>8}  statuses"
    ]
    for name in report.services():
        s = report.summary(name)
        statuses = " ".join(f"{k}:{v}" for k, v in s["statuses"].items())
        lines.append(
            f"{name:<12} {s['requests']:>8} {s['ok']:>7} {s['lost']:>5} {s['skipped']:>7} "
            f"{s['ok_per_s']:>6.1f} {_ms(s['p50_s']):>8} {_ms(s['p99_s']):>8}  {statuses}"
        )
    return "\n".join(lines)


def cmd_load(args: argparse.Namespace) -> int:
    from gateway.settings import load_or_exit

    settings = load_or_exit(args.config)
    host, port = (args.target.host, args.target.port) if args.target else _target(settings)
    if host not in LOOPBACK:
        print(f"sluice load: only loopback targets are allowed, got {host!r}", file=sys.stderr)
        return 2
    streams = streams_from_settings(
        settings,
        rps=args.rps,
        burst_rps=args.burst_rps,
        burst_s=args.burst_s,
        period_s=args.period_s,
        first_burst_s=args.first_burst_s,
    )
    if not streams:
        print("sluice load: no service with a route in the config", file=sys.stderr)
        return 2
    print(f"sluice load: {args.duration:g}s against http://{host}:{port}", flush=True)
    for s in streams:
        print(f"  {s.describe()}", flush=True)
    report = asyncio.run(
        run_load(
            streams,
            host,
            port,
            args.duration,
            max_requests=args.max_requests,
            max_in_flight=args.max_in_flight,
            timeout_s=args.timeout,
            progress=print_progress,
        )
    )
    print(format_report(report), flush=True)
    if args.json is not None:
        body = {
            "duration_s": report.duration_s,
            "services": {name: report.summary(name) for name in report.services()},
        }
        args.json.write_text(json.dumps(body, indent=2) + "\n")
    answered = sum(report.summary(name)["ok"] for name in report.services())
    if report.results and answered == 0:
        print(
            f"sluice load: every one of {len(report.results)} request(s) failed "
            f"(is the gateway running at http://{host}:{port}?)",
            file=sys.stderr,
        )
        return 1
    return 0


def print_progress(report: LoadReport, elapsed_s: float) -> None:
    """One line on stderr while the load runs: sent so far, answered 2xx, failed."""
    sent = len(report.results)
    ok = sum(1 for r in report.results if 200 <= r.status < 300)
    print(
        f"  {elapsed_s:4.0f}s: {sent} done, {ok} ok, {sent - ok} failed, "
        f"{sum(report.skipped.values())} skipped",
        file=sys.stderr,
        flush=True,
    )


def add_load_command(sub: Any, add_config: Any) -> None:
    p = sub.add_parser(
        "load",
        help="drive a bounded open-loop load at the gateway (loopback only)",
        description="Steady load on services that keep a replica, periodic bursts on those "
        "that scale to zero; prints requests, statuses and p50/p99 per service.",
    )
    add_config(p)

    def positive(raw: str) -> float:
        value = float(raw)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {raw!r}")
        return value

    p.add_argument("--duration", type=positive, default=60.0, help="seconds of sending (60)")
    p.add_argument("--rps", type=positive, default=20.0, help="steady rate per service (20)")
    p.add_argument("--burst-rps", type=positive, default=20.0, help="rate during a burst (20)")
    p.add_argument("--burst-s", type=positive, default=10.0, help="length of a burst (10)")
    p.add_argument("--period-s", type=positive, default=30.0, help="a burst starts every (30)")
    p.add_argument(
        "--first-burst-s", type=float, default=10.0, help="when the first burst starts (10)"
    )
    p.add_argument("--max-requests", type=int, default=200_000, help="cap on requests sent")
    p.add_argument("--max-in-flight", type=int, default=2_000, help="cap on requests waiting")
    p.add_argument("--timeout", type=positive, default=60.0, help="per-request deadline (60)")
    p.add_argument(
        "--target",
        type=address_argument,
        help="host:port or http://host:port to send to (default: the config's listen)",
    )
    p.add_argument("--json", type=Path, help="also write the summary as JSON to this file")
    p.set_defaults(func=cmd_load)
