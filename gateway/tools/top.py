"""``sluice top``: a live terminal view of every service (rich Live + Table).

Reads the admin API of a running gateway (``/api/services`` and ``/api/decisions``) every
``--interval`` seconds and shows per service: request rate, in flight, queued, p99 latency,
replicas (ready / decided), CPU per replica, its share of the budget, and the reason of the
scaler's last decision (with ``scaling.metrics``: the metric that won and each metric's own
answer).  ``--once`` prints one frame and exits (scripts, tests).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from gateway.tools.address import add_admin_arguments


def fetch(admin_url: str, token: str | None) -> dict[str, Any]:
    """One snapshot: ``{"services": ..., "decisions": ... | None}`` from the admin API."""
    import httpx

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(base_url=admin_url, headers=headers, timeout=5) as client:
        services = client.get("/api/services")
        services.raise_for_status()
        decisions = client.get("/api/decisions")
        decided = decisions.json() if decisions.status_code == 200 else None
    return {"services": services.json()["services"], "decisions": decided}


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.0f} ms"


KEY_REASONS = ("reclaimed", "gave back", "borrows", "lends", "squeezed", "clamped", "frozen")
"""Reason lines that say what the budget or a bound did: shown first when present."""


def last_reason(decision: dict[str, Any] | None) -> str:
    """A decision in one cell: its rule, then the reason lines that say what the budget or a
    bound did (lent, reclaimed, clamped...), else its last line (the budget outcome)."""
    if decision is None:
        return "-"
    lines: list[str] = [
        part.strip() for reason in decision.get("reasons") or [] for part in reason.split(";")
    ]
    key = [line for line in lines if line.startswith(KEY_REASONS)]
    shown = key or lines[-1:]
    metrics = metric_summary(decision.get("metrics"))
    return "; ".join([str(decision["rule"]), *metrics, *shown])


def metric_summary(metrics: dict[str, Any] | None) -> list[str]:
    """``scaling.metrics`` in one phrase: the winner and every metric's own answer
    (``-``: no data or no opinion), e.g. ``active_users won: 3 (concurrency 1, p95 -)``."""
    if not metrics:
        return []
    answers = ", ".join(
        f"{a['name']} {'-' if a['replicas'] is None else a['replicas']}"
        for a in metrics.get("answers") or []
    )
    if metrics.get("held_by"):
        held = ", ".join(metrics["held_by"])
        return [f"held at {metrics['replicas']}: no data from {held} ({answers})"]
    winner = metrics.get("winner") or "-"
    return [f"{winner} won: {metrics['replicas']} ({answers})"]


COLUMNS: tuple[tuple[str, str, int], ...] = (
    # (header, justify, drop order: the highest goes first when the terminal is too narrow)
    ("service", "left", 0),
    ("rps", "right", 1),
    ("err%", "right", 2),
    ("in flight", "right", 8),
    ("queued", "right", 6),
    ("p99", "right", 4),
    ("replicas", "right", 3),
    ("cpu/replica", "right", 7),
    ("budget share", "right", 9),
    ("last decision", "left", 5),
)
"""Every column, in display order.  At 80 columns ``budget share`` and ``in flight`` go first."""
LAST_DECISION_MIN = 24
"""Columns are dropped until the last decision keeps at least this many characters."""


def error_percent(sig: dict[str, Any], previous: dict[str, Any] | None) -> str:
    """Errors among completions since the previous frame (since start on the first frame)."""
    done = sig.get("completions_total", 0)
    errors = sig.get("errors_total", 0)
    if previous is not None:
        done -= previous.get("completions_total", 0)
        errors -= previous.get("errors_total", 0)
    if done <= 0:
        return "-"
    return f"{100 * errors / done:.1f}"


def _rows(snapshot: dict[str, Any], previous: dict[str, Any] | None) -> list[dict[str, str]]:
    services = snapshot["services"]
    decided = snapshot["decisions"]
    latest: dict[str, Any] = decided["latest"] if decided else {}
    budget_cpu = decided["budget"]["cpu"] if decided else None
    before = previous["services"] if previous else {}
    rows = []
    for name, view in sorted(services.items()):
        sig = view["signals"]
        d = latest.get(name)
        ready = sum(1 for ep in view["endpoints"] if ep["routable"])
        if d and budget_cpu:
            share = f"{d['allocated_cores']:.2f} ({100 * d['allocated_cores'] / budget_cpu:.0f}%)"
        else:
            share = "-"
        old = before.get(name)
        rows.append(
            {
                "service": name,
                "rps": f"{sig['rps']:.1f}",
                "err%": error_percent(sig, old["signals"] if old else None),
                "in flight": str(sig["in_flight"]),
                "queued": str(sig["queued"]),
                "p99": _ms(sig.get("latency_p99_s")),
                "replicas": f"{ready}/{d['replicas']}" if d else str(ready),
                "cpu/replica": f"{d['cpu_per_replica_cores']:.2f}" if d else "-",
                "budget share": share,
                "last decision": last_reason(d),
            }
        )
    return rows


def fitting_columns(rows: list[dict[str, str]], width: int) -> list[str]:
    """The columns that fit ``width`` characters, dropping by priority (see :data:`COLUMNS`)."""
    kept = [c for c, _, _ in COLUMNS]

    def needed(columns: list[str]) -> int:
        total = 1  # the left border
        for c in columns:
            if c == "last decision":
                cell = LAST_DECISION_MIN
            else:
                cell = max([len(c)] + [len(r[c]) for r in rows])
            total += cell + 3  # padding on both sides and a border
        return total

    for column, _, _ in sorted(COLUMNS, key=lambda c: -c[2]):
        if needed(kept) <= width or column == "service":
            break
        kept.remove(column)
    return kept


def render(
    snapshot: dict[str, Any],
    admin_url: str,
    width: int | None = None,
    previous: dict[str, Any] | None = None,
) -> Group:
    """One frame; ``width`` (the terminal's) drops columns by priority so each row fits."""
    decided = snapshot["decisions"]
    rows = _rows(snapshot, previous)
    shown = fitting_columns(rows, width) if width is not None else [c for c, _, _ in COLUMNS]
    table = Table(expand=True)
    for column, justify, _ in COLUMNS:
        if column in shown:
            table.add_column(column, justify=justify, no_wrap=column != "last decision")  # type: ignore[arg-type]
    for row in rows:
        table.add_row(*(row[c] for c in shown))
    if decided:
        b = decided["budget"]
        mode = "applied" if decided["applied"] else "recommend-only"
        title = (
            f"sluice top — {admin_url} — budget {b['allocated_cores']:.2f} of {b['cpu']:g} CPU"
            f"{' (auto)' if b.get('cpu_config') == 'auto' else ''} "
            f"allocated ({b['arbitration']}, {mode}), {decided['ticks']} ticks"
        )
    else:
        title = f"sluice top — {admin_url} — no scaler runs in this gateway"
    return Group(Text(title, style="bold"), table)


def _admin_url(args: argparse.Namespace) -> tuple[str, str | None]:
    from gateway.telemetry.view import _admin_defaults

    url, token = _admin_defaults(args.config)
    if args.admin:
        url = args.admin.url
    return url, args.token or os.environ.get("SLUICE_ADMIN_TOKEN") or token


def cmd_top(args: argparse.Namespace) -> int:
    import httpx

    url, token = _admin_url(args)
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)  # piped or captured: room for the reasons
    try:
        snapshot = fetch(url, token)
        if args.once:
            console.print(render(snapshot, url, console.width))
            return 0
        with Live(render(snapshot, url, console.width), console=console, screen=False) as live:
            while True:
                time.sleep(args.interval)
                previous, snapshot = snapshot, fetch(url, token)
                live.update(render(snapshot, url, console.width, previous))
    except httpx.HTTPError as e:
        console.print(f"sluice top: cannot read {url}: {e}")
        return 1
    except KeyboardInterrupt:
        return 0


def add_top_command(sub: Any, add_config: Any) -> None:
    p = sub.add_parser(
        "top", help="live view of every service: load, replicas, CPU, budget, decisions"
    )
    add_config(p)
    add_admin_arguments(p)
    p.add_argument("--interval", type=float, default=1.0, help="seconds between frames (1)")
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.set_defaults(func=cmd_top)
