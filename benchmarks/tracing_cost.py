"""Tracing hook cost per request, in CPU time, without a proxy around it.

    python benchmarks/tracing_cost.py              # ~20 s
    python benchmarks/tracing_cost.py --requests 20000 --ratio 0.01

Measures what the data plane's tracing hooks cost per request (``time.process_time_ns``,
median of ``--rounds`` rounds) in the cases that matter:

* ``off``: the single ``if tracing is not None`` branch the data plane keeps when tracing is off;
* ``unsampled-root``: tracing on, no incoming ``traceparent``, not sampled (one random number);
* ``unsampled-parent``: tracing on, the caller sent ``traceparent`` with the sampled flag off;
* ``sampled``: a full recorded request: SERVER span, queue child, one CLIENT attempt, the
  upstream ``traceparent``, both ends, into the ring buffer *and* a BatchSpanProcessor whose
  exporter encodes each batch to OTLP protobuf with Sluice's encoder (the otlp_http export's
  CPU, minus the network write);
* ``mix@ratio``: the expected cost per request at ``--ratio`` = unsampled-root + ratio × sampled.

It then expresses the ``mix`` cost as a share of a proxy's per-request CPU budget
(``--proxy-rps`` requests per second per core; the default 67,000 is the figure for a
minimal uvloop + httptools proxy on this kind of machine): the req/s a proxy loses is about
``cost / (cost + 1e9 / proxy_rps)``.  Writes ``benchmarks/results/tracing-cost-<UTC>.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opentelemetry.sdk.trace import ReadableSpan  # noqa: E402
from opentelemetry.sdk.trace.export import (  # noqa: E402
    BatchSpanProcessor,
    SpanExporter,
    SpanExportResult,
)

from gateway.settings import TracesConfig  # noqa: E402
from gateway.telemetry.otlp import encode_spans  # noqa: E402
from gateway.telemetry.propagation import format_traceparent  # noqa: E402
from gateway.telemetry.provider import Telemetry  # noqa: E402
from gateway.telemetry.requests import RequestTracing  # noqa: E402

RESULTS_DIR = ROOT / "benchmarks" / "results"


class EncodingExporter(SpanExporter):
    """Encodes every batch to OTLP protobuf bytes, as the otlp_http exporter does, then drops it."""

    def __init__(self) -> None:
        self.spans = 0
        self.bytes = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.bytes += len(encode_spans(spans))
        self.spans += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def per_request_ns(fn: Callable[[int], None], n: int, rounds: int) -> float:
    samples = []
    for _ in range(rounds):
        t0 = time.process_time_ns()
        fn(n)
        samples.append((time.process_time_ns() - t0) / n)
    return statistics.median(samples)


def one_request(tracing: RequestTracing | None, traceparent: bytes | None) -> None:
    span = tracing.start(traceparent, None, b"GET", b"/api/items", b"gw.local") if tracing else None
    if span is not None:
        span.routed("api", "/api")
        span.queued(0.0001)
        attempt = span.attempt("127.0.0.1", 8001, 1)
        assert attempt.traceparent
        attempt.end(200, response_body_bytes=3)
        span.end(200, 0, 3)


def run(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, float] = {}
    n, rounds = args.requests, args.rounds

    def off(k: int) -> None:
        tracing: RequestTracing | None = None
        for _ in range(k):
            if tracing is not None:
                one_request(tracing, None)

    def nothing(k: int) -> None:
        for _ in range(k):
            pass

    results["off"] = max(
        0.0, per_request_ns(off, n * 10, rounds) - per_request_ns(nothing, n * 10, rounds)
    )

    unsampled = Telemetry.start(TracesConfig(enabled=True, sampler={"ratio": 0.0}), env={})  # type: ignore[arg-type]
    tracing = unsampled.requests
    assert tracing is not None
    results["unsampled-root"] = per_request_ns(
        lambda k: [one_request(tracing, None) for _ in range(k)] and None, n, rounds
    )
    parent = format_traceparent(0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7, 0)
    results["unsampled-parent"] = per_request_ns(
        lambda k: [one_request(tracing, parent) for _ in range(k)] and None, n, rounds
    )
    unsampled.shutdown()

    exporter = EncodingExporter()
    sampled = Telemetry.start(
        TracesConfig(enabled=True, sampler={"ratio": 1.0}),  # type: ignore[arg-type]
        env={},
        extra_processors=(BatchSpanProcessor(exporter),),
    )
    full = sampled.requests
    assert full is not None
    m = max(1, n // 10)

    def recorded(k: int) -> None:
        for i in range(k):
            one_request(full, None)
            if i % 300 == 299:  # keep under the batch queue (2048 spans): none dropped
                sampled.force_flush(30)
        sampled.force_flush(30)  # count the export's CPU in the same window

    results["sampled"] = per_request_ns(recorded, m, rounds)
    sampled.shutdown()
    assert exporter.spans == 3 * m * rounds, (exporter.spans, m)
    results[f"mix@{args.ratio:g}"] = results["unsampled-root"] + args.ratio * results["sampled"]
    budget_ns = 1e9 / args.proxy_rps
    loss = {name: value / (value + budget_ns) for name, value in results.items()}
    return {
        "per_request_ns": results,
        "proxy_rps_per_core": args.proxy_rps,
        "proxy_ns_per_request": budget_ns,
        "estimated_rps_loss": loss,
        "ratio": args.ratio,
        "requests": n,
        "rounds": rounds,
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "processor": platform.processor() or platform.machine(),
        },
    }


def print_table(result: dict[str, Any]) -> None:
    print(f"{'case':<18} {'ns/request':>11} {'est. req/s lost':>16}")
    for name, ns in result["per_request_ns"].items():
        print(f"{name:<18} {ns:>11.0f} {result['estimated_rps_loss'][name] * 100:>15.2f}%")
    print(
        f"(against a proxy at {result['proxy_rps_per_core']:,} req/s per core = "
        f"{result['proxy_ns_per_request']:.0f} ns of CPU per request)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--requests", type=int, default=50_000, help="requests per round (default 50000)"
    )
    parser.add_argument("--rounds", type=int, default=5, help="rounds, median reported (default 5)")
    parser.add_argument(
        "--ratio", type=float, default=0.01, help="sampling ratio for the mix (default 0.01)"
    )
    parser.add_argument(
        "--proxy-rps", type=float, default=67_000, help="proxy req/s per core (default 67000)"
    )
    parser.add_argument("--out", type=Path, default=None, help="JSON output file")
    args = parser.parse_args(argv)
    result = run(args)
    print_table(result)
    out = args.out or RESULTS_DIR / f"tracing-cost-{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%SZ}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
