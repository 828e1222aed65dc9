"""The CLI's edges as a user meets them: --version, ``check FILE``, empty and misspelt configs,
``simulate --out`` problems, ``load`` against nothing, addresses with or without ``http://``,
and shell completion."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

import gateway
from gateway.tools.address import parse_address
from tests.support.processes import ROOT, upstreams
from tests.support.processes import gateway as running_gateway


def sluice(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def test_version() -> None:
    done = sluice("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"sluice {gateway.__version__}"


def test_check_takes_the_file_as_a_positional_argument() -> None:
    done = sluice("check", "config/sluice.yaml")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("config/sluice.yaml: ok: platform local, 2 service(s)")


def test_an_empty_config_is_an_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing yet\n")
    done = sluice("check", str(empty))
    assert done.returncode == 2
    assert done.stderr.strip() == f"{empty}: the file is empty: a config needs at least " + (
        "'services:' (see sluice schema)"
    )


def test_unknown_keys_get_a_did_you_mean(tmp_path: Path) -> None:
    config = tmp_path / "typo.yaml"
    config.write_text(
        "budgt: {cpu: 1}\n"
        "services:\n"
        "  api:\n"
        "    routes: [{path: /, path_typ: Prefix}]\n"
        "    endpoints: ['127.0.0.1:9']\n"
        "    scaling: {min_replica: 1, zzz: 2}\n"
    )
    done = sluice("check", "--config", str(config))
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert f"{config}: budgt: unknown key (did you mean 'budget'?)" in lines
    assert (
        f"{config}: services.api.routes[0].path_typ: unknown key (did you mean 'path_type'?)"
        in lines
    )
    assert (
        f"{config}: services.api.scaling.min_replica: unknown key (did you mean 'min_replicas'?)"
        in lines
    )
    assert f"{config}: services.api.scaling.zzz: unknown key" in lines  # nothing close


def test_simulate_out_that_cannot_be_written_is_a_message_not_a_traceback(
    tmp_path: Path,
) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    done = sluice(
        "simulate",
        "--config",
        "config/sluice.yaml",
        "--workload",
        "config/examples/workload.yaml",
        "--out",
        str(not_a_dir),
    )
    assert done.returncode == 2
    assert (
        done.stderr.strip() == f"sluice simulate: --out {not_a_dir}: exists and is not a directory"
    )
    assert "Traceback" not in done.stderr
    helped = sluice("simulate", "--help")
    config_help = helped.stdout[helped.stdout.index("--config CONFIG") :].split("\n  -")[0]
    assert "default" not in config_help


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_load_exits_nonzero_when_every_request_failed_and_shows_progress() -> None:
    port = free_port()  # nothing listens there
    done = sluice(
        "load",
        "--config",
        "config/sluice.yaml",
        "--target",
        f"http://127.0.0.1:{port}",
        "--duration",
        "6",
        "--rps",
        "2",
        "--burst-rps",
        "2",
        "--first-burst-s",
        "0",
    )
    assert done.returncode == 1
    assert "every one of" in done.stderr and "request(s) failed" in done.stderr
    assert "5s: " in done.stderr and " failed, " in done.stderr  # the progress line


@pytest.mark.parametrize("scheme", ["", "http://"])
def test_top_and_traces_take_the_admin_address_with_or_without_http(
    tmp_path: Path, scheme: str
) -> None:
    with upstreams("a1") as ups:
        cfg = {"services": {"api": {"routes": [{"path": "/"}], "endpoints": [ups[0].address]}}}
        with running_gateway(cfg, tmp_path / "g.yaml") as g:
            admin = scheme + g.admin_url.removeprefix("http://")
            top = sluice("top", "--once", "--admin", admin)
            assert top.returncode == 0, top.stdout + top.stderr
            assert "api" in top.stdout
            traces = sluice("traces", "--admin", admin, "--json")
            assert traces.returncode == 0, traces.stderr


def test_one_address_parser() -> None:
    assert parse_address("127.0.0.1:9901").url == "http://127.0.0.1:9901"
    assert parse_address("http://127.0.0.1:9901/").url == "http://127.0.0.1:9901"
    assert parse_address("[::1]:8080").host == "::1"
    assert parse_address("https://gw.example:8443/admin").url == "https://gw.example:8443/admin"
    for bad in ("", "127.0.0.1:http", "ftp://x:1", "127.0.0.1"):
        with pytest.raises(ValueError):
            parse_address(bad)
    done = sluice("top", "--once", "--admin", "127.0.0.1:notaport")
    assert done.returncode == 2 and "port must be a number" in done.stderr


def test_completion_scripts(tmp_path: Path) -> None:
    bash = sluice("completion", "bash")
    assert bash.returncode == 0
    script = tmp_path / "sluice.bash"
    script.write_text(bash.stdout)
    probe = subprocess.run(
        [
            "bash",
            "-c",
            f"source {script}; COMP_WORDS=(sluice run --log-format ''); COMP_CWORD=3; "
            '_sluice; echo "${COMPREPLY[@]}"; COMP_WORDS=(sluice ch); COMP_CWORD=1; '
            '_sluice; echo "${COMPREPLY[@]}"',
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert probe.stdout.splitlines() == ["text json", "check"]
    zsh = sluice("completion", "zsh")
    assert zsh.returncode == 0 and zsh.stdout.startswith("#compdef sluice")
    assert "completion) _arguments" in zsh.stdout and "'1:value:(bash zsh)'" in zsh.stdout


@pytest.mark.parametrize(
    "args", [["schema"], ["check", "config/sluice.yaml"], ["completion", "bash"]]
)
def test_output_into_a_closed_pipe_is_no_traceback(args: list[str]) -> None:
    """`sluice schema | head -1`: the reader is gone before (or while) sluice writes."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write now fails with EPIPE
    try:
        done = subprocess.run(
            [sys.executable, "-m", "gateway", *args],
            cwd=ROOT,
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert done.stderr == ""
    assert done.returncode == 141, "128 + SIGPIPE, like a CLI the signal stopped"
