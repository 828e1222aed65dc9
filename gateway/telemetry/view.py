"""``sluice traces``: fetch recent traces from the admin API and draw each as a waterfall tree.

One table per trace: the span tree (indented with tree guides), kind, duration, a waterfall bar
placed on the trace's timeline, and the attributes a person reads first (service, route, status,
upstream endpoint, attempt and retry reason, scaler rule and replicas).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gateway.tools.address import add_admin_arguments

BAR_WIDTH = 32


def _children(
    spans: Sequence[Mapping[str, Any]],
) -> tuple[list[Mapping[str, Any]], dict[str, list[Mapping[str, Any]]]]:
    ids = {s["span_id"] for s in spans}
    roots: list[Mapping[str, Any]] = []
    children: dict[str, list[Mapping[str, Any]]] = {}
    for span in sorted(spans, key=lambda s: (s["start_unix_nano"], s["end_unix_nano"])):
        parent = span.get("parent_span_id")
        if parent is None or parent not in ids:
            roots.append(span)
        else:
            children.setdefault(parent, []).append(span)
    return roots, children


def walk(spans: Sequence[Mapping[str, Any]]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """``(tree prefix, span)`` in display order: parents before children, by start time."""
    roots, children = _children(spans)

    def visit(
        span: Mapping[str, Any], lead: str, last: bool, top: bool
    ) -> Iterator[tuple[str, Mapping[str, Any]]]:
        yield ("" if top else lead + ("└─ " if last else "├─ ")), span
        kids = children.get(span["span_id"], [])
        inner = "" if top else lead + ("   " if last else "│  ")
        for i, kid in enumerate(kids):
            yield from visit(kid, inner, i == len(kids) - 1, False)

    for root in roots:
        yield from visit(root, "", True, True)


def bar(
    start_ns: int, end_ns: int, trace_start_ns: int, trace_ns: int, width: int = BAR_WIDTH
) -> str:
    """A waterfall bar: '█' where the span ran on the trace's timeline, '·' elsewhere."""
    if trace_ns <= 0:
        return "█" * width
    left = int((start_ns - trace_start_ns) / trace_ns * width)
    left = min(max(left, 0), width - 1)
    length = max(1, round((end_ns - start_ns) / trace_ns * width))
    length = min(length, width - left)
    return "·" * left + "█" * length + "·" * (width - left - length)


def _duration(ms: float) -> str:
    if ms >= 1000:
        return f"{ms / 1000:.2f} s"
    if ms >= 1:
        return f"{ms:.2f} ms"
    return f"{ms * 1000:.0f} µs"


def details(span: Mapping[str, Any]) -> str:
    """The attributes worth a glance, in words."""
    a: Mapping[str, Any] = span.get("attributes", {})
    parts: list[str] = []
    if "sluice.service" in a:
        parts.append(f"service={a['sluice.service']}")
    if "sluice.decision.rule" in a:
        prev = a.get("sluice.decision.previous_replicas")
        cpu = a.get("sluice.decision.cpu_per_replica_cores")
        moved = f"{prev}→" if prev is not None else ""
        parts.append(
            f"rule={a['sluice.decision.rule']} replicas {moved}{a.get('sluice.decision.replicas')}"
        )
        if isinstance(cpu, int | float):
            parts.append(f"cpu {cpu:.2f}/replica")
        for key, word in (
            ("lent_cores", "lent"),
            ("borrowed_cores", "borrowed"),
            ("held_cores", "held"),
            ("held_from_cores", "held from it"),
            ("reclaimed_cores", "reclaimed"),
            ("gave_back_cores", "gave back"),
        ):
            value = a.get(f"sluice.cpu.{key}")
            if isinstance(value, int | float) and value > 0:
                parts.append(f"{word} {value:.2f} cores")
        clamps = a.get("sluice.decision.clamps") or []
        parts.extend(str(c) for c in clamps)
    if "sluice.scaler.changed" in a:
        names = a.get("sluice.scaler.changed_services") or []
        parts.append(f"changed: {', '.join(names) if names else 'none'}")
    if span.get("kind") == "CLIENT" and "server.address" in a:
        parts.append(f"→ {a['server.address']}:{a.get('server.port', '')}")
        parts.append(f"attempt {a.get('sluice.upstream.attempt', 1)}")
        if "sluice.retry.reason" in a:
            parts.append(f"retry: {a['sluice.retry.reason']}")
    elif span.get("kind") == "SERVER" and "url.path" in a:
        parts.append(f"path={a['url.path']}")
    if "sluice.admission.queue_wait_s" in a and span.get("kind") == "SERVER":
        wait = a["sluice.admission.queue_wait_s"]
        if isinstance(wait, int | float) and wait > 0:
            parts.append(f"queued {_duration(wait * 1e3)}")
    if "http.response.status_code" in a:
        parts.append(f"status={a['http.response.status_code']}")
    if "error.type" in a:
        parts.append(f"error={a['error.type']}")
    for event in span.get("events", []):
        reason = event.get("attributes", {}).get("sluice.reason")
        parts.append(f"{event['name']}" + (f" ({reason})" if reason else ""))
    return "  ".join(parts)


def render(traces: Sequence[Mapping[str, Any]], console: Console) -> None:
    """Print one waterfall table per trace."""
    if not traces:
        console.print("no traces match (is tracing enabled, and has traffic been sampled?)")
        return
    for t in traces:
        status = t.get("status", "ok")
        head = Text()
        head.append(f"trace {t['trace_id']}", style="bold")
        head.append(
            f"  {t.get('root', '')}  {_duration(t['duration_ms'])}  {t['span_count']} span(s)  "
        )
        head.append(status.upper(), style="red bold" if status == "error" else "green")
        if t.get("services"):
            head.append(f"  services: {', '.join(t['services'])}")
        if t.get("error_spans") and status != "error":
            head.append(f"  ({t['error_spans']} failed span(s))", style="yellow")
        if t.get("dropped_spans"):
            head.append(f"  ({t['dropped_spans']} span(s) not kept)")
        console.print(head)
        table = Table(show_header=True, header_style="dim", box=None, pad_edge=False)
        table.add_column("span", no_wrap=True)
        table.add_column("kind", no_wrap=True)
        table.add_column("duration", justify="right", no_wrap=True)
        table.add_column("waterfall", no_wrap=True)
        table.add_column("details")
        width = min(max(console.width - 92, 10), BAR_WIDTH)
        start = int(t["start_unix_nano"])
        total = int(t["duration_ms"] * 1e6)
        for prefix, span in walk(t["spans"]):
            error = span.get("status") == "ERROR"
            table.add_row(
                Text(prefix + span["name"], style="red" if error else ""),
                span.get("kind", ""),
                _duration(span["duration_ms"]),
                Text(
                    bar(span["start_unix_nano"], span["end_unix_nano"], start, total, width),
                    style="red" if error else "cyan",
                ),
                details(span),
            )
        console.print(table)
        console.print()


def _admin_defaults(config: Path | None) -> tuple[str, str | None]:
    from gateway.settings import ConfigError, load_settings

    if config is None or not config.exists():
        return "http://127.0.0.1:9901", None
    try:
        settings = load_settings(config)
    except ConfigError as e:
        raise SystemExit("\n".join(e.problems)) from None
    host = settings.admin.host
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    token = settings.admin.token.get_secret_value() if settings.admin.token else None
    return f"http://{host}:{settings.admin.port}", token


def cmd_traces(args: argparse.Namespace) -> int:
    import httpx

    url, token = _admin_defaults(args.config)
    if args.admin:
        url = args.admin.url
    token = args.token or os.environ.get("SLUICE_ADMIN_TOKEN") or token
    params: dict[str, str] = {"limit": str(args.limit)}
    for key in ("service", "status", "trace_id", "kind"):
        value = getattr(args, key)
        if value is not None:
            params[key] = value
    if args.min_duration_ms is not None:
        params["min_duration_ms"] = str(args.min_duration_ms)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        response = httpx.get(
            f"{url}/api/traces", params=params, headers=headers, timeout=args.timeout_s
        )
    except httpx.HTTPError as e:
        print(f"sluice traces: cannot reach the admin API at {url}: {e}", file=sys.stderr)
        return 1
    if response.status_code != 200:
        try:
            problem = response.json().get("error", response.text)
        except ValueError:
            problem = response.text
        print(
            f"sluice traces: {url}/api/traces answered {response.status_code}: {problem}",
            file=sys.stderr,
        )
        return 2 if response.status_code == 400 else 1
    body = response.json()
    if args.json:
        sys.stdout.write(json.dumps(body, indent=2) + "\n")
        return 0
    console = Console(width=args.width) if args.width else Console()
    if body.get("buffer", {}).get("tracing") == "off":
        console.print("tracing is off: set telemetry.traces.enabled: true in the config")
    render(body["traces"], console)
    return 0


def add_traces_command(sub: Any, add_config: Any) -> None:
    """Register ``sluice traces`` on the CLI's subparsers."""
    p = sub.add_parser(
        "traces", help="show recent traces from a running gateway as waterfall trees"
    )
    add_config(p)
    add_admin_arguments(p)
    p.add_argument("--service", help="only traces that touch this service")
    p.add_argument("--min-duration-ms", type=float, help="only traces at least this long")
    p.add_argument("--status", choices=["ok", "error"], help="only ok or only failed traces")
    p.add_argument("--trace-id", help="one trace, by its 32-hex-digit id")
    p.add_argument(
        "--kind", choices=["request", "scaler"], help="only request or only scaler traces"
    )
    p.add_argument("--limit", type=int, default=10, help="at most this many traces (default 10)")
    p.add_argument("--json", action="store_true", help="print the API's JSON instead of trees")
    p.add_argument("--width", type=int, help="output width in columns (default: the terminal's)")
    p.add_argument("--timeout-s", type=float, default=5.0, help="HTTP timeout (default 5 s)")
    p.set_defaults(func=cmd_traces)
