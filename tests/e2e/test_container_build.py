"""The image's build, replayed without Docker: the build context is assembled from the
Dockerfile's own COPY lines (honouring .dockerignore), a wheel is built from it and
installed into a fresh venv exactly as the build stage does, then the entrypoint
command runs from that venv, outside the repository.

Differences from ``docker build``, all forced by running offline: the wheel is built
without build isolation (the test environment's setuptools instead of a downloaded one) and
the image venv reaches Sluice's dependencies through a ``.pth`` line naming the *test
environment's* site-packages instead of downloading them (the build's ``pip install
--require-hashes -r requirements.lock``; the lock itself is checked in
tests/unit/test_dockerfile.py). Never ``--system-site-packages``:
that is the base interpreter's site-packages, which on a fresh machine holds none of them.
"""

from __future__ import annotations

import http.client
import os
import shutil
import signal
import site
import socket
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.support.dockerfile import is_ignored, parse_dockerfile, parse_dockerignore

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _assemble_context(dest: Path) -> None:
    dockerfile = parse_dockerfile((ROOT / "Dockerfile").read_text())
    rules = parse_dockerignore((ROOT / ".dockerignore").read_text())
    for copy in dockerfile.stage("build").all("COPY"):
        *sources, target = copy.words
        for source in sources:
            src = ROOT / source
            files = [src] if src.is_file() else sorted(p for p in src.rglob("*") if p.is_file())
            for file in files:
                rel = file.relative_to(ROOT).as_posix()
                if is_ignored(rel, rules):
                    continue
                if target.endswith("/") and src.is_dir():
                    out = dest / target / file.relative_to(src)
                elif target.endswith("/"):
                    out = dest / target / file.name
                else:
                    out = dest / target
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(file, out)


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("image")
    context = base / "src"
    _assemble_context(context)
    assert not list(context.rglob("__pycache__")), ".dockerignore must keep bytecode out"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    # build stage: python -m pip wheel --no-deps --wheel-dir /wheels .
    subprocess.run(
        [
            *pip,
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "--wheel-dir",
            str(base / "wheels"),
            ".",
        ],
        cwd=context,
        check=True,
        timeout=120,
    )
    # python -m venv --without-pip /opt/sluice
    venv = base / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)],
        check=True,
        timeout=60,
    )
    (image_site,) = (venv / "lib").glob("python3*/site-packages")
    # Dependencies from the running test environment, after the venv's own site-packages
    # (so the wheel's gateway/scaler win); .pth files in the added directory are not run,
    # so an editable install of the repository there stays invisible.
    (image_site / "_test_dependencies.pth").write_text(
        "\n".join(p for p in site.getsitepackages() if Path(p).is_dir()) + "\n"
    )
    # python -m pip --python /opt/sluice/bin/python install /wheels/sluice-*.whl
    (wheel,) = (base / "wheels").glob("sluice-*.whl")
    subprocess.run(
        [
            *pip,
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        check=True,
        timeout=120,
    )
    return venv


def _env(venv: Path) -> dict[str, str]:
    # as the image's ENV: PATH=/opt/sluice/bin:$PATH; nothing from the repo on sys.path
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"
    return env


def test_the_wheel_carries_both_packages(venv: Path) -> None:
    (wheel,) = (venv.parent / "wheels").glob("sluice-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    sources = [
        path.relative_to(ROOT).as_posix()
        for package in ("gateway", "scaler")
        for path in (ROOT / package).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    ]
    assert "gateway/cli.py" in sources and "scaler/py.typed" in sources
    missing = sorted(set(sources) - names)
    assert missing == [], f"the image would lack {missing} (pyproject package-data?)"
    assert not [n for n in names if n.startswith("tests/")]


def test_the_venv_runs_sluice_from_its_own_site_packages(venv: Path, tmp_path: Path) -> None:
    out = subprocess.run(
        ["python", "-c", "import gateway, scaler; print(gateway.__file__, scaler.__file__)"],
        cwd=tmp_path,
        env=_env(venv),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    for path in out.stdout.split():
        assert Path(path).is_relative_to(venv), path


def test_entrypoint_checks_the_image_config(venv: Path, tmp_path: Path) -> None:
    config = ROOT / "config" / "examples" / "container.yaml"
    out = subprocess.run(
        ["sluice", "check", "--config", str(config)],
        cwd=tmp_path,
        env=_env(venv),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "ok: platform static, 1 service(s)" in out.stdout
    usage = subprocess.run(
        ["sluice", "run", "--help"],
        cwd=tmp_path,
        env=_env(venv),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert usage.returncode == 0 and "--config" in usage.stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def test_entrypoint_serves_health_and_stops_on_sigterm(venv: Path, tmp_path: Path) -> None:
    data = yaml.safe_load((ROOT / "config" / "examples" / "container.yaml").read_text())
    admin_port = _free_port()
    data["listen"] = {"host": "127.0.0.1", "port": _free_port()}  # loopback only in tests
    data["admin"] = {"host": "127.0.0.1", "port": admin_port}
    config = tmp_path / "sluice.yaml"
    config.write_text(yaml.safe_dump(data))
    proc = subprocess.Popen(
        ["sluice", "run", "--config", str(config)],
        cwd=tmp_path,
        env=_env(venv),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        status = None
        for _ in range(200):  # bounded polling, no timing assertion
            if proc.poll() is not None:
                break
            try:
                conn = http.client.HTTPConnection("127.0.0.1", admin_port, timeout=1)
                conn.request("GET", "/healthz")
                status = conn.getresponse().status
                conn.close()
                break
            except OSError:
                time.sleep(0.1)
        assert status == 200, proc.stdout.read().decode() if proc.poll() is not None else status
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        assert proc.stdout is not None
        proc.stdout.close()
