"""``sluice check`` and ``sluice run`` with TLS certificates, as a user runs them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from tests.support.certs import make_ca


def sluice(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def write_config(path: Path, certificates: list[dict[str, str]]) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "listen": {"host": "127.0.0.1", "port": 0},
                "admin": {"host": "127.0.0.1", "port": 0},
                "tls": {"listen": {"host": "127.0.0.1", "port": 0}, "certificates": certificates},
                "services": {"api": {"routes": [{"path": "/"}], "endpoints": ["127.0.0.1:9"]}},
            }
        )
    )
    return path


def test_check_names_the_mismatched_key_and_run_refuses_to_start(tmp_path: Path) -> None:
    ca = make_ca(tmp_path)
    a = ca.issue(tmp_path, "a", ["a.example.test"])
    b = ca.issue(tmp_path, "b", ["b.example.test"])
    (tmp_path / "certs").mkdir()
    a.cert_file.rename(tmp_path / "certs" / "a.pem")
    config = write_config(
        tmp_path / "sluice.yaml", [{"cert_file": "certs/a.pem", "key_file": "b.key"}]
    )
    done = sluice("check", "--config", str(config))
    assert done.returncode == 2, done.stdout
    assert done.stderr.strip() == (
        f"{config}: tls.certificates[0]: {tmp_path / 'b.key'}: the key does not match the "
        f"certificate {tmp_path / 'certs' / 'a.pem'}"
    )
    run = sluice("run", "--config", str(config))
    assert run.returncode == 2
    assert f"{tmp_path / 'b.key'}: the key does not match" in run.stderr
    assert b.key_file.exists()


def test_check_warns_about_an_expired_certificate(tmp_path: Path) -> None:
    ca = make_ca(tmp_path)
    old = ca.issue(tmp_path, "old", ["old.example.test"], expired=True)
    config = write_config(tmp_path / "sluice.yaml", [old.config()])
    done = sluice("check", "--config", str(config))
    assert done.returncode == 0, done.stderr
    assert f"warning: {old.cert_file}: certificate expired" in done.stderr
    assert "tls: 1 certificate(s) on 127.0.0.1:0" in done.stdout
