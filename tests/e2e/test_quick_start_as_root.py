"""The README's quick start as root, as a new user runs it: the system Python, a venv in a
directory every user can read (the README's ``/opt/sluice``), Sluice installed into it (not
editable), ``sluice run`` on the shipped demo config; then ``ps -o user= -p <replica pid>``
is not root (it is ``nobody``), and the demo answers through the gateway.

Offline differences, as in test_container_build.py: the wheel is built without build
isolation, and the venv reaches Sluice's dependencies through a ``.pth`` line naming the test
environment's site-packages (instead of ``pip install`` downloading them). The test skips
where those are not readable by ``nobody`` or the system Python is another version.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import site
import stat
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from gateway.platforms.local.identity import default_identity
from tests.support.localpool import ROOT, needs_cgroups
from tests.support.processes import Gateway
from tests.support.procs import MARKER_VAR, pids_with_marker

SYSTEM_PYTHON = Path("/usr/bin/python3")
DEPENDENCIES = [Path(p) for p in site.getsitepackages() if Path(p).is_dir()]


def _readable_by_everyone(path: Path) -> bool:
    real = Path(os.path.realpath(path))
    for d in [*real.parents, real]:
        if not d.stat().st_mode & stat.S_IXOTH:
            return False
    return bool(real.stat().st_mode & stat.S_IROTH)


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "the quick start as root needs root"
    if default_identity() is None:
        return "no user 'nobody'"
    if not SYSTEM_PYTHON.exists():
        return f"no {SYSTEM_PYTHON}"
    version = subprocess.run(
        [str(SYSTEM_PYTHON), "-c", "import sys; print(sys.version_info[:2])"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    ).stdout.strip()
    if version != str(sys.version_info[:2]):
        return f"{SYSTEM_PYTHON} is {version}, the test environment's packages are for another"
    if not all(_readable_by_everyone(d) for d in DEPENDENCIES):
        return f"the test environment's packages ({DEPENDENCIES}) are not readable by nobody"
    return None


_WHY = _why_not()
pytestmark = [
    pytest.mark.slow,
    needs_cgroups,
    pytest.mark.skipif(_WHY is not None, reason=f"{_WHY}"),
]


@pytest.fixture(scope="module")
def opt_sluice() -> Iterator[Path]:
    """`python3 -m venv /opt/sluice && /opt/sluice/bin/pip install .`, in a directory like /opt."""
    base = Path(tempfile.mkdtemp(prefix="sluice-opt-", dir="/tmp"))
    base.chmod(0o755)
    try:
        context = base / "src"
        for name in ("pyproject.toml", "README.md"):
            context.mkdir(exist_ok=True)
            shutil.copy2(ROOT / name, context / name)
        for package in ("gateway", "scaler"):
            shutil.copytree(
                ROOT / package, context / package, ignore=shutil.ignore_patterns("__pycache__")
            )
        pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
        wheels = base / "wheels"
        subprocess.run(
            [
                *pip,
                "wheel",
                "--no-deps",
                "--no-build-isolation",
                "--no-index",
                "-w",
                str(wheels),
                ".",
            ],
            cwd=context,
            check=True,
            timeout=180,
        )
        venv = base / "sluice"
        subprocess.run(
            [str(SYSTEM_PYTHON), "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60
        )
        (image_site,) = (venv / "lib").glob("python3*/site-packages")
        (image_site / "_test_dependencies.pth").write_text(
            "\n".join(str(d) for d in DEPENDENCIES) + "\n"
        )
        (wheel,) = wheels.glob("sluice-*.whl")
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
            timeout=180,
        )
        yield venv
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_the_quick_start_as_root_runs_the_demo_replicas_as_nobody(
    opt_sluice: Path, tmp_path: Path
) -> None:
    demo = yaml.safe_load((ROOT / "config" / "sluice.yaml").read_text())
    demo["listen"]["port"] = 0
    demo["admin"]["port"] = 0
    marker = uuid.uuid4().hex
    starts = random.sample(range(20000, 60000, 100), len(demo["services"]))  # distinct
    for svc, start in zip(demo["services"].values(), starts, strict=True):
        svc["replicas"]["port_range"] = [start, start + 19]
        svc["replicas"]["env"] = {**svc["replicas"].get("env", {}), MARKER_VAR: marker}
        assert "user" not in svc["replicas"], "the shipped demo leaves the user to Sluice"
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "sluice.yaml").write_text(yaml.safe_dump(demo))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.Popen(
        [str(opt_sluice / "bin" / "sluice"), "run"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    lines: list[str] = []
    ready = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if Gateway.LINE.search(line):
                ready.set()
        ready.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        assert ready.wait(60), "".join(lines)
        m = next(m for line in lines if (m := Gateway.LINE.search(line)))
        url = m.group(1)
        with httpx.Client(base_url=url, timeout=60) as c:
            answered = False
            for _ in range(300):  # bounded: the api replica starts and becomes ready
                try:
                    answered = c.get("/api/hello").status_code == 200
                except httpx.HTTPError:
                    answered = False
                if answered:
                    break
                threading.Event().wait(0.1)
            assert answered, "".join(lines)[-3000:]
        pids = pids_with_marker(marker)
        assert pids
        for pid in pids:
            user = subprocess.run(
                ["ps", "-o", "user=", "-p", str(pid)],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            ).stdout.strip()
            assert user == "nobody", f"replica {pid} runs as {user!r}"
        text = "".join(lines)
        assert "replicas NOT started" not in text and "ROOT" not in text, text[-3000:]
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
        reader.join(5)
        assert proc.stdout is not None
        proc.stdout.close()
    assert code == 0, "".join(lines)[-3000:]
