"""``sluice top``: a live terminal view of every service (rich Live + Table).

Reads the admin API of a running gateway (``/api/services`` and ``/api/decisions``) every
``--interval`` seconds and shows per service: request rate, in flight, queued, p99 latency,
replicas (ready / decided), CPU per replica, its share of the budget, and the reason of the
scaler's last decision.  ``--once`` prints one frame and exits (scripts, tests).
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
    return "; ".join([str(decision["rule"]), *shown])


def render(snapshot: dict[str, Any], admin_url: str) -> Group:
    services = snapshot["services"]
    decided = snapshot["decisions"]
    latest: dict[str, Any] = decided["latest"] if decided else {}
    budget_cpu = decided["budget"]["cpu"] if decided else None
    table = Table(expand=True)
    for column, justify in (
        ("service", "left"),
        ("rps", "right"),
        ("in flight", "right"),
        ("queued", "right"),
        ("p99", "right"),
        ("replicas", "right"),
        ("cpu/replica", "right"),
        ("budget share", "right"),
        ("last decision", "left"),
    ):
        table.add_column(column, justify=justify, no_wrap=column != "last decision")  # type: ignore[arg-type]
    for name, view in sorted(services.items()):
        sig = view["signals"]
        d = latest.get(name)
        ready = sum(1 for ep in view["endpoints"] if ep["routable"])
        replicas = f"{ready}/{d['replicas']}" if d else str(ready)
        cpu = f"{d['cpu_per_replica_cores']:.2f}" if d else "-"
        if d and budget_cpu:
            share = f"{d['allocated_cores']:.2f} ({100 * d['allocated_cores'] / budget_cpu:.0f}%)"
        else:
            share = "-"
        table.add_row(
            name,
            f"{sig['rps']:.1f}",
            str(sig["in_flight"]),
            str(sig["queued"]),
            _ms(sig.get("latency_p99_s")),
            replicas,
            cpu,
            share,
            last_reason(d),
        )
    if decided:
        b = decided["budget"]
        mode = "applied" if decided["applied"] else "recommend-only"
        title = (
            f"sluice top — {admin_url} — budget {b['allocated_cores']:.2f} of {b['cpu']:g} CPU "
            f"allocated ({b['arbitration']}, {mode}), {decided['ticks']} ticks"
        )
    else:
        title = f"sluice top — {admin_url} — no scaler runs in this gateway"
    return Group(Text(title, style="bold"), table)


def _admin_url(args: argparse.Namespace) -> tuple[str, str | None]:
    from gateway.telemetry.view import _admin_defaults

    url, token = _admin_defaults(args.config)
    if args.admin:
        url = args.admin.rstrip("/")
    return url, args.token or os.environ.get("SLUICE_ADMIN_TOKEN") or token


def cmd_top(args: argparse.Namespace) -> int:
    import httpx

    url, token = _admin_url(args)
    console = Console()
    if not console.is_terminal:
        console = Console(width=160)  # piped or captured: room for the reasons
    try:
        if args.once:
            console.print(render(fetch(url, token), url))
            return 0
        with Live(render(fetch(url, token), url), console=console, screen=False) as live:
            while True:
                time.sleep(args.interval)
                live.update(render(fetch(url, token), url))
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
    p.add_argument("--admin", help="admin API base URL (default: from the config's admin section)")
    p.add_argument(
        "--token", help="admin bearer token (default: $SLUICE_ADMIN_TOKEN, then the config's)"
    )
    p.add_argument("--interval", type=float, default=1.0, help="seconds between frames (1)")
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.set_defaults(func=cmd_top)
