"""The ``sluice`` command: run | check | schema | crd | simulate | traces | load | top | completion.

Exit codes: 0 ok, 2 bad configuration or usage, 1 runtime failure.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import gateway
from gateway.settings import (
    ConfigError,
    Settings,
    json_schema,
    load_or_exit,
    load_settings,
)

if TYPE_CHECKING:  # the simulator loads only when `sluice simulate` runs
    from scaler.simulate.model import Admission

DEFAULT_CONFIG = Path("config/sluice.yaml")
"""Used when ``--config`` is not given and this file exists (relative to the working dir)."""


def _budget_text(settings: Settings) -> str:
    cpu = settings.budget.cpu
    if cpu != "auto":
        return f"{cpu:g}"
    if settings.platform == "kubernetes":
        return "auto (from the nodes and pods, once listed)"
    from gateway.platforms.machine import budget_cpu

    measured = budget_cpu(settings.budget)
    return f"{measured.cores:g} ({measured.source})"


def packaged_config() -> Path:
    """The demo config shipped inside the package (``gateway/data/sluice.yaml``)."""
    from importlib.resources import files

    return Path(str(files("gateway").joinpath("data", "sluice.yaml")))


def default_config() -> Path:
    """``./config/sluice.yaml`` if present, else the copy shipped inside the package."""
    return DEFAULT_CONFIG if DEFAULT_CONFIG.is_file() else packaged_config()


def _add_config(parser: argparse.ArgumentParser, required: bool = False) -> None:
    parser.add_argument(
        "--config",
        "-c",
        type=Path,
        required=required,
        default=None,
        help="YAML config file"
        if required
        else f"YAML config file (default: ./{DEFAULT_CONFIG} if present, else the demo config "
        "shipped with Sluice)",
    )


def _summary(name: str, service: object) -> str:
    from gateway.settings import ServiceConfig

    assert isinstance(service, ServiceConfig)
    routes = (
        ", ".join(f"{r.host or '*'}{r.path} ({r.path_type})" for r in service.routes) or "no routes"
    )
    s = service.scaling
    return (
        f"{name}: {routes}; {len(service.endpoints)} static endpoint(s); {service.balancer}; "
        f"replicas {s.min_replicas}..{s.max_replicas}, cpu {s.cpu.min:g}..{s.cpu.max:g} cores/replica, "
        f"{s.mode} on {s.metric} target {s.target:g}"
    )


def cmd_check(args: argparse.Namespace) -> int:
    if args.file is not None:
        if args.given_config is not None and args.given_config != args.file:
            print("sluice check: give the file once (FILE or --config)", file=sys.stderr)
            return 2
        args.config = args.file
    try:
        settings = load_settings(args.config)
    except ConfigError as e:
        for line in e.problems:
            print(line, file=sys.stderr)
        return 2
    from gateway.dataplane.tls import check_tls

    problems, warnings = check_tls(settings, str(args.config), time.time())
    for line in problems:
        print(line, file=sys.stderr)
    if problems:
        return 2
    for line in warnings:
        print(f"warning: {line}", file=sys.stderr)
    print(
        f"{args.config}: ok: platform {settings.platform}, {len(settings.services)} service(s), "
        f"budget {_budget_text(settings)} CPU ({settings.budget.arbitration})"
    )
    for name, service in settings.services.items():
        print(f"  {_summary(name, service)}")
    if settings.tls is not None:
        print(
            f"  tls: {len(settings.tls.certificates)} certificate(s) on "
            f"{settings.tls.listen.host}:{settings.tls.listen.port}"
        )
    if settings.platform == "local":
        for warning in _local_warnings(settings):
            print(f"WARNING: {warning}", file=sys.stderr)
    return 0


def _local_warnings(settings: object) -> list[str]:
    """How the local platform would run the replicas, where that is as root (see
    ``gateway.platforms.local.identity``), judged for a Sluice run by this user."""
    import os

    from gateway.platforms.local.identity import check_warnings
    from gateway.settings import Settings

    assert isinstance(settings, Settings)
    out = []
    for name, service in settings.services.items():
        r = service.replicas
        if r is not None:
            out += check_warnings(
                name,
                r.command,
                r.user,
                r.group,
                euid=os.geteuid(),
                path_env=os.environ.get("PATH"),
            )
    return out


def cmd_crd(args: argparse.Namespace) -> int:
    from gateway.platforms.kubernetes.crd import crd_yaml

    sys.stdout.write(crd_yaml())
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    sys.stdout.write(json_schema())
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from gateway.telemetry.logs import configure

    configure(args.log_level, args.log_format)
    settings = load_or_exit(args.config)
    from gateway.app import run

    return run(settings, config_path=args.config)


def simulated_admission(settings: Settings) -> dict[str, Admission]:
    """Each service's ``limits`` as ``sluice simulate``'s model follows them: concurrency
    slots per replica and the bounded queue, also where requests wait while the service has
    no ready replica (as ``platform: local`` holds them)."""
    from scaler.simulate.model import Admission

    return {
        name: Admission(
            slots_per_replica=service.limits.concurrency_per_replica,
            queue_max=service.limits.queue.max,
            queue_timeout_s=service.limits.queue.timeout_s,
            cold_start_timeout_s=service.limits.queue.cold_start_timeout_s,
            cold_start_max=service.limits.queue.cold_start_max,
        )
        for name, service in settings.services.items()
    }


def not_modelled(settings: Settings) -> list[str]:
    """What the config would make the gateway do that ``sluice simulate`` does not model (it
    follows the concurrency slots and the queue as ``platform: local`` does, and sends each
    request to the ready replica with the fewest in flight): one line per service and
    setting."""
    lines: list[str] = []
    for name, service in settings.services.items():
        limits, key = service.limits, f"services.{name}"
        if service.balancer != "least_request":
            lines.append(
                f"{key}.balancer: {service.balancer}: not modelled: the model sends each "
                "request to the ready replica with the fewest requests in flight (least_request "
                "picks the less loaded of two at random)"
            )
        if limits.rate_limit is not None:
            lines.append(
                f"{key}.limits.rate_limit: not modelled: the gateway answers 429 above "
                f"{limits.rate_limit.rps:g} req/s; the model admits every request"
            )
    return lines


def cmd_simulate(args: argparse.Namespace) -> int:
    settings = load_or_exit(args.config)
    from scaler.simulate.cli import run_command

    policies = {name: service.scaling for name, service in settings.services.items()}
    admission = simulated_admission(settings)
    budget, cpu_window_s = settings.budget, 0.0
    if settings.platform == "kubernetes":
        # as that platform runs: CPU use from PodMetrics, a limit quota moved at ticks only
        budget = budget.model_copy(update={"lending": False})
        cpu_window_s = settings.kubernetes.pod_metrics_interval_s
    timeouts = {name: s.timeouts.response_header_s for name, s in settings.services.items()}
    code = run_command(
        args,
        policies,
        budget,
        str(args.config),
        admission,
        cpu_window_s=cpu_window_s,
        response_timeouts_s=timeouts,
    )
    if code == 0:  # after the run's figures, which these notes qualify
        for line in not_modelled(settings):
            print(f"sluice simulate: note: {args.config}: {line}", file=sys.stderr)
    return code


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sluice", description="Ingress-aware gateway with a built-in autoscaler."
    )
    parser.add_argument("--version", action="version", version=f"sluice {gateway.__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("run", help="run the gateway (data plane, admin plane, scaler)")
    _add_config(p)
    from gateway.telemetry.logs import FORMATS, LEVELS

    p.add_argument(
        "--log-level",
        choices=LEVELS,
        default="info",
        help="least severe level logged (default: info; debug adds every scaler tick)",
    )
    p.add_argument(
        "--log-format",
        choices=FORMATS,
        default="text",
        help="text lines, or one JSON object per line (default: text); logs go to stderr",
    )
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("check", help="validate a config file and summarise it")
    p.add_argument("file", nargs="?", type=Path, metavar="FILE", help="the config file to check")
    _add_config(p)
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("schema", help="print the config file's JSON Schema")
    p.set_defaults(func=cmd_schema)

    p = sub.add_parser(
        "crd",
        help="print the ScalingPolicy CustomResourceDefinition (generated from the scaling model)",
    )
    p.set_defaults(func=cmd_crd)

    from scaler.simulate.cli import add_arguments as add_simulate_arguments

    p = sub.add_parser(
        "simulate", help="replay a workload through a queueing model: Sluice vs a baseline"
    )
    _add_config(p, required=True)
    add_simulate_arguments(p)
    p.set_defaults(func=cmd_simulate)

    from gateway.telemetry.view import add_traces_command

    add_traces_command(sub, _add_config)
    from gateway.tools.loadgen import add_load_command
    from gateway.tools.top import add_top_command

    add_load_command(sub, _add_config)
    add_top_command(sub, _add_config)

    p = sub.add_parser(
        "completion",
        help="print a shell completion script",
        description='bash: eval "$(sluice completion bash)"; zsh: sluice completion zsh > '
        "a file named _sluice in a directory of $fpath",
    )
    p.add_argument("shell", choices=["bash", "zsh"])
    p.set_defaults(func=cmd_completion)
    return parser


def cmd_completion(args: argparse.Namespace) -> int:
    from gateway.completion import script

    sys.stdout.write(script(args.shell, build_parser()))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if "config" in args:
        args.given_config = args.config
    if "config" in args and args.config is None:
        args.config = default_config()
    try:
        result: int = args.func(args)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`sluice schema | head`): stop quietly with the status of a
        # process killed by SIGPIPE (128 + 13), as well-behaved CLIs do.  stdout now points
        # at /dev/null so the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    return result


if __name__ == "__main__":
    raise SystemExit(main())
