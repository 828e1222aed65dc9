"""A small Dockerfile and .dockerignore reader, enough to check Sluice's own Dockerfile.

Follows the Dockerfile reference: parser directives (``# syntax=``) only before the
first instruction, ``#`` comment lines (also inside continuations), ``\\`` line
continuations, case-insensitive instruction keywords, exec (JSON array) and shell forms,
``--flag=value`` options on COPY/ADD/FROM/RUN, ``ARG`` defaults before the first
``FROM`` substituted into ``FROM``.  ``.dockerignore`` patterns follow Go's
``filepath.Match`` plus ``**`` and ``!`` exceptions, the last matching line wins.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

INSTRUCTIONS = frozenset(
    {
        "ADD",
        "ARG",
        "CMD",
        "COPY",
        "ENTRYPOINT",
        "ENV",
        "EXPOSE",
        "FROM",
        "HEALTHCHECK",
        "LABEL",
        "MAINTAINER",
        "ONBUILD",
        "RUN",
        "SHELL",
        "STOPSIGNAL",
        "USER",
        "VOLUME",
        "WORKDIR",
    }
)
_DIRECTIVE = re.compile(r"^#\s*([a-zA-Z][a-zA-Z0-9_-]*)\s*=\s*(.*?)\s*$")
_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


class DockerfileError(ValueError):
    """The Dockerfile is malformed; the message names the line."""


@dataclass(frozen=True)
class Instruction:
    """One instruction: keyword, ``--flags``, arguments (exec form: a list), source line."""

    keyword: str
    flags: dict[str, str]
    args: str | list[str]
    line: int

    @property
    def words(self) -> list[str]:
        return self.args if isinstance(self.args, list) else self.args.split()


@dataclass
class Stage:
    """A build stage: its base image, optional name and instructions after ``FROM``."""

    image: str
    name: str | None
    line: int
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction | None:
        found = self.all(keyword)
        return found[-1] if found else None


@dataclass
class Dockerfile:
    directives: dict[str, str]
    global_args: dict[str, str]
    stages: list[Stage]

    def stage(self, name: str) -> Stage:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(name)


def _logical_lines(text: str) -> tuple[dict[str, str], list[tuple[int, str]]]:
    directives: dict[str, str] = {}
    lines: list[tuple[int, str]] = []
    in_directives = True
    current: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if in_directives:
            match = _DIRECTIVE.match(stripped)
            if match:
                directives[match.group(1).lower()] = match.group(2)
                continue
            in_directives = False
        if stripped.startswith("#") or (not stripped and not current):
            continue  # comment lines vanish, also inside a continuation
        if not current:
            start = number
        if stripped.endswith("\\"):
            current.append(stripped[:-1].strip())
            continue
        current.append(stripped)
        lines.append((start, " ".join(part for part in current if part)))
        current = []
    if current:
        raise DockerfileError(f"line {start}: continuation runs past the end of the file")
    return directives, lines


def _instruction(number: int, line: str) -> Instruction:
    keyword, _, rest = line.partition(" ")
    keyword = keyword.upper()
    if keyword not in INSTRUCTIONS:
        raise DockerfileError(f"line {number}: unknown instruction {keyword!r}")
    rest = rest.strip()
    flags: dict[str, str] = {}
    if keyword in {"ADD", "COPY", "FROM", "RUN"}:
        while rest.startswith("--"):
            flag, _, rest = rest.partition(" ")
            name, _, value = flag[2:].partition("=")
            flags[name] = value
            rest = rest.strip()
    args: str | list[str] = rest
    if rest.startswith("[") and keyword in {
        "CMD",
        "ENTRYPOINT",
        "RUN",
        "SHELL",
        "COPY",
        "ADD",
        "VOLUME",
    }:
        try:
            parsed = json.loads(rest)
        except json.JSONDecodeError as e:
            raise DockerfileError(f"line {number}: {keyword} exec form is not JSON: {e}") from None
        if not isinstance(parsed, list) or not all(isinstance(p, str) for p in parsed):
            raise DockerfileError(f"line {number}: {keyword} exec form must be a list of strings")
        args = parsed
    if not args and keyword not in {"CMD", "ENTRYPOINT"}:
        raise DockerfileError(f"line {number}: {keyword} needs arguments")
    return Instruction(keyword, flags, args, number)


def substitute(value: str, variables: dict[str, str]) -> str:
    """Expand ``$NAME`` and ``${NAME}`` (unknown names become empty, as in Docker)."""
    return _VARIABLE.sub(lambda m: variables.get(m.group(1) or m.group(2), ""), value)


def parse_dockerfile(text: str) -> Dockerfile:
    directives, lines = _logical_lines(text)
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for number, line in lines:
        instruction = _instruction(number, line)
        if instruction.keyword == "FROM":
            words = instruction.words
            if len(words) not in (1, 3) or (len(words) == 3 and words[1].upper() != "AS"):
                raise DockerfileError(f"line {number}: FROM takes 'image [AS name]', got {line!r}")
            name = words[2].lower() if len(words) == 3 else None
            if name is not None and any(s.name == name for s in stages):
                raise DockerfileError(f"line {number}: stage name {name!r} used twice")
            stages.append(Stage(substitute(words[0], global_args), name, number))
        elif not stages:
            if instruction.keyword != "ARG":
                raise DockerfileError(f"line {number}: only ARG may come before the first FROM")
            key, _, default = str(instruction.args).partition("=")
            global_args[key.strip()] = default.strip().strip('"')
        else:
            stages[-1].instructions.append(instruction)
    if not stages:
        raise DockerfileError("no FROM instruction")
    return Dockerfile(directives, global_args, stages)


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if pattern.startswith("**", i):
            out += ".*"
            i += 2
            if pattern.startswith("/", i):
                out = out[:-2] + "(?:.*/)?"
                i += 1
            continue
        if c == "*":
            out += "[^/]*"
        elif c == "?":
            out += "[^/]"
        else:
            out += re.escape(c)
        i += 1
    return re.compile(out)


def parse_dockerignore(text: str) -> list[tuple[bool, re.Pattern[str]]]:
    """Patterns as (is_exception, regex), in file order."""
    rules = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        exception = line.startswith("!")
        pattern = line[1:].strip() if exception else line
        pattern = pattern.strip("/").removeprefix("./")
        rules.append((exception, _pattern_regex(pattern)))
    return rules


def is_ignored(path: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Whether a context-relative path is left out of the build context.

    A pattern that matches a directory leaves out everything below it; the last
    matching rule decides.
    """
    parts = Path(path).parts
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    ignored = False
    for exception, regex in rules:
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            ignored = not exception
    return ignored
