"""The Dockerfile, checked without a Docker engine: it parses, copies files that exist and
are in the build context, runs as non-root, exposes the ports its config listens on, and
its entrypoint is the ``sluice`` console script.  (That the entrypoint works in a venv built
the same way is tests/e2e/test_container_build.py.)"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from gateway.settings import load_settings
from tests.support.dockerfile import (
    Dockerfile,
    DockerfileError,
    is_ignored,
    parse_dockerfile,
    parse_dockerignore,
)

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = ["sluice", "run", "--config", "/etc/sluice/sluice.yaml"]


@pytest.fixture(scope="module")
def dockerfile() -> Dockerfile:
    return parse_dockerfile((ROOT / "Dockerfile").read_text())


@pytest.fixture(scope="module")
def ignore_rules() -> list[tuple[bool, re.Pattern[str]]]:
    return parse_dockerignore((ROOT / ".dockerignore").read_text())


def test_two_stages_on_a_slim_python_311_base(dockerfile: Dockerfile) -> None:
    assert [s.name for s in dockerfile.stages] == ["build", "runtime"]
    for stage in dockerfile.stages:
        assert re.fullmatch(r"python:3\.11-slim(-[a-z]+)?(@sha256:[0-9a-f]{64})?", stage.image), (
            stage.image
        )
    assert dockerfile.directives.get("syntax", "").startswith("docker/dockerfile:")


def test_copy_from_names_an_earlier_stage(dockerfile: Dockerfile) -> None:
    seen: set[str] = set()
    for stage in dockerfile.stages:
        for copy in stage.all("COPY"):
            if "from" in copy.flags:
                assert copy.flags["from"] in seen, f"line {copy.line}: unknown stage"
        if stage.name:
            seen.add(stage.name)


def test_every_copied_source_exists_and_is_in_the_build_context(
    dockerfile: Dockerfile, ignore_rules: list[tuple[bool, re.Pattern[str]]]
) -> None:
    sources = 0
    for stage in dockerfile.stages:
        for copy in stage.all("COPY") + stage.all("ADD"):
            if "from" in copy.flags:
                continue
            *srcs, _dest = copy.words
            for src in srcs:
                sources += 1
                path = ROOT / src
                assert path.exists(), f"line {copy.line}: COPY source {src!r} is not in the repo"
                assert not is_ignored(src.rstrip("/"), ignore_rules), (
                    f"line {copy.line}: {src!r} is excluded by .dockerignore"
                )
    assert sources >= 4


def test_build_stage_copies_every_package_the_wheel_needs(dockerfile: Dockerfile) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    copied = {
        src.rstrip("/") for copy in dockerfile.stage("build").all("COPY") for src in copy.words[:-1]
    }
    assert "pyproject.toml" in copied
    assert project["project"]["readme"] in copied
    for pattern in project["tool"]["setuptools"]["packages"]["find"]["include"]:
        assert pattern.rstrip("*") in copied, f"package {pattern} is not copied"


def test_runtime_stage_is_lean_and_non_root(dockerfile: Dockerfile) -> None:
    runtime = dockerfile.stage("runtime")
    user = runtime.last("USER")
    assert user is not None, "the runtime stage must set USER"
    args = {a.words[0].split("=")[0]: a.words[0].partition("=")[2] for a in runtime.all("ARG")}
    uid = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), ""), user.words[0])
    name, _, group = uid.partition(":")
    assert name.isdigit() and int(name) != 0, f"USER must be a numeric non-root uid, got {uid!r}"
    assert group.isdigit() and int(group) != 0
    # only runtime pieces: the venv from the build stage, no package installs, no compilers
    for run in runtime.all("RUN"):
        command = " ".join(run.words)
        assert "pip" not in command and "apt-get" not in command, command
    venv = [c for c in runtime.all("COPY") if c.flags.get("from") == "build"]
    assert [c.words for c in venv] == [["/opt/sluice", "/opt/sluice"]]


def test_entrypoint_is_sluice_run_with_the_mounted_config(dockerfile: Dockerfile) -> None:
    runtime = dockerfile.stage("runtime")
    entrypoint = runtime.last("ENTRYPOINT")
    assert entrypoint is not None
    assert entrypoint.args == ENTRYPOINT, "exec form, so SIGTERM reaches sluice directly"
    assert runtime.last("CMD") is None
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["sluice"] == "gateway.cli:main"
    env = " ".join(" ".join(e.words) for e in runtime.all("ENV"))
    assert "PATH=/opt/sluice/bin:$PATH" in env


def test_exposed_ports_are_the_ports_the_image_config_listens_on(dockerfile: Dockerfile) -> None:
    runtime = dockerfile.stage("runtime")
    exposed = {int(p.split("/")[0]) for e in runtime.all("EXPOSE") for p in e.words}
    config_copy = [c for c in runtime.all("COPY") if c.words[-1] == ENTRYPOINT[-1]]
    assert len(config_copy) == 1, "the runtime stage must ship a default /etc/sluice/sluice.yaml"
    source = ROOT / config_copy[0].words[0]
    settings = load_settings(source)
    assert exposed == {settings.listen.port, settings.admin.port} == {8080, 9901}
    assert settings.listen.host == "0.0.0.0", "a container must listen on every interface"
    assert yaml.safe_load(source.read_text())["platform"] == settings.platform


def test_dockerignore_keeps_local_state_out(
    ignore_rules: list[tuple[bool, re.Pattern[str]]],
) -> None:
    for path in [".git/config", ".venv/bin/python", "gateway/__pycache__/cli.cpython-311.pyc"]:
        assert is_ignored(path, ignore_rules), path
    for path in ["gateway/cli.py", "scaler/engine.py", "pyproject.toml", "README.md"]:
        assert not is_ignored(path, ignore_rules), path


# ---- the parser itself


def test_parser_handles_continuations_comments_flags_and_args() -> None:
    text = (
        "# syntax=docker/dockerfile:1\n"
        "ARG BASE=python:3.11-slim\n"
        "FROM ${BASE} AS one\n"
        "RUN echo a \\\n"
        "# a comment inside the continuation\n"
        "    && echo b\n"
        "copy --from=one --chown=1:1 /a /b\n"
        'ENTRYPOINT ["x", "y"]\n'
    )
    parsed = parse_dockerfile(text)
    stage = parsed.stage("one")
    assert stage.image == "python:3.11-slim"
    assert stage.all("RUN")[0].args == "echo a && echo b"
    copy = stage.all("COPY")[0]
    assert copy.flags == {"from": "one", "chown": "1:1"}
    assert copy.words == ["/a", "/b"]
    assert stage.all("ENTRYPOINT")[0].args == ["x", "y"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("RUN echo\n", "line 1: only ARG may come before the first FROM"),
        ("FROM a\nFETCH b\n", "line 2: unknown instruction 'FETCH'"),
        ("FROM a\nRUN x \\\n", "line 2: continuation runs past the end"),
        ('FROM a\nCMD ["x", \n', "line 2: CMD exec form is not JSON"),
        ("FROM a AS b\nFROM c AS b\n", "line 2: stage name 'b' used twice"),
        ("", "no FROM instruction"),
    ],
)
def test_parser_rejects_malformed_files(text: str, message: str) -> None:
    with pytest.raises(DockerfileError, match=re.escape(message)):
        parse_dockerfile(text)


def test_dockerignore_patterns() -> None:
    rules = parse_dockerignore("**/*.pyc\ndocs\n!docs/keep.md\n*.egg-info\n")
    assert is_ignored("a/b/c.pyc", rules)
    assert is_ignored("c.pyc", rules)
    assert is_ignored("docs/other.md", rules)
    assert not is_ignored("docs/keep.md", rules)
    assert is_ignored("sluice.egg-info/PKG-INFO", rules)
    assert not is_ignored("gateway/cli.py", rules)


def test_labels_and_a_healthcheck_on_the_shipped_admin_port(dockerfile: Dockerfile) -> None:
    runtime = dockerfile.stage("runtime")
    labels = " ".join(" ".join(label.words) for label in runtime.all("LABEL"))
    for key in ("title", "description", "version"):
        assert f"org.opencontainers.image.{key}=" in labels, key
    version = next(
        a.words[0] for a in runtime.all("ARG") if a.words[0].startswith("SLUICE_VERSION=")
    )
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert version.split("=")[1] == project["project"]["version"]
    check = runtime.last("HEALTHCHECK")
    assert check is not None
    text = " ".join(check.words)
    settings = load_settings(ROOT / "config/examples/container.yaml")
    assert f"http://127.0.0.1:{settings.admin.port}/healthz" in text


def _lock() -> dict[str, tuple[str, list[str]]]:
    """requirements.lock as {name: (version, [sha256...])}."""
    text = (ROOT / "requirements.lock").read_text()
    pins: dict[str, tuple[str, list[str]]] = {}
    for block in re.split(r"\n(?=[A-Za-z])", text):
        match = re.match(r"([A-Za-z0-9_.-]+)==(\S+)", block)
        if match:
            hashes = re.findall(r"--hash=sha256:([0-9a-f]{64})\b", block)
            pins[canonicalize_name(match.group(1))] = (match.group(2), hashes)
    return pins


def test_the_lock_pins_every_runtime_dependency_with_hashes() -> None:
    """The image installs requirements.lock with --require-hashes: every dependency of
    pyproject.toml (and theirs) pinned to one version with the sha256 of its files."""
    pins = _lock()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for line in project["project"]["dependencies"]:
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate(
            {"sys_platform": "linux", "python_version": "3.11", "platform_system": "Linux"}
        ):
            continue
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement.name} is not in requirements.lock"
        assert requirement.specifier.contains(pins[name][0], prereleases=True), (
            f"{name}=={pins[name][0]} does not satisfy {requirement.specifier}"
        )
    for name, (version, hashes) in pins.items():
        assert hashes, f"{name}=={version} has no hash"
    text = (ROOT / "requirements.lock").read_text()
    assert "--index-url" not in text and "--find-links" not in text, "no local indexes"
    assert "sluice" not in pins, "Sluice itself is the wheel, installed after"


def test_the_build_installs_the_lock_with_hashes_before_the_wheel(dockerfile: Dockerfile) -> None:
    build = dockerfile.stage("build")
    runs = [" ".join(r.words) for r in build.all("RUN")]
    (lock_run,) = [r for r in runs if "requirements.lock" in r]
    assert "--require-hashes" in lock_run and "-r requirements.lock" in lock_run
    (wheel_run,) = [r for r in runs if "sluice-*.whl" in r]
    assert runs.index(lock_run) < runs.index(wheel_run), "dependencies first (a cached layer)"
    install = wheel_run[wheel_run.index("install") :]
    assert "--no-deps" in install, "nothing but the lock's files reaches the venv"
    copied = [src for copy in build.all("COPY") for src in copy.words[:-1]]
    assert copied.index("requirements.lock") < copied.index("gateway/")


def test_the_base_image_is_a_build_argument_pinnable_by_digest(dockerfile: Dockerfile) -> None:
    text = (ROOT / "Dockerfile").read_text()
    (default,) = re.findall(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.M)
    assert re.fullmatch(r"python:3\.11-slim-bookworm(@sha256:[0-9a-f]{64})?", default)
    for stage in dockerfile.stages:
        assert stage.image == default, "both stages on the same (pinnable) base"
    assert (ROOT / ".ci" / "pin-base-image").is_file()
