"""``sluice completion bash|zsh``: shell completion scripts generated from the argument parser.

The scripts complete subcommands, each subcommand's options and choices, and file names
after options that take a path; they are static text (no Python runs at completion time).
"""

from __future__ import annotations

import argparse


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse has no public accessor for subparsers
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> list[str]:
    return sorted(o for a in parser._actions for o in a.option_strings if o.startswith("--"))


def _choices(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    """Positional or option -> its fixed choices."""
    out: dict[str, list[str]] = {}
    for a in parser._actions:
        if a.choices is not None and not isinstance(a, argparse._SubParsersAction):
            names = [o for o in a.option_strings if o.startswith("--")] or [a.dest]
            for name in names:
                out[name] = [str(c) for c in a.choices]
    return out


def bash(parser: argparse.ArgumentParser) -> str:
    commands = _commands(parser)
    files = '            [[ "$cur" != -* ]] && COMPREPLY+=($(compgen -f -- "$cur"))\n'
    cases = []
    for name, sub in sorted(commands.items()):
        choices = _choices(sub)
        option_cases = "".join(
            f'            {opt}) COMPREPLY=($(compgen -W "{" ".join(values)}" -- "$cur")); return;;\n'
            for opt, values in sorted(choices.items())
            if opt.startswith("--")
        )
        positional = next((v for k, v in choices.items() if not k.startswith("--")), None)
        words = " ".join(_options(sub) + (positional or []))
        cases.append(
            f"        {name})\n"
            f'            case "$prev" in\n{option_cases}'
            "            --config|-c|--out|--json|--workload) "
            'COMPREPLY=($(compgen -f -- "$cur")); return;;\n'
            "            esac\n"
            f'            COMPREPLY=($(compgen -W "{words}" -- "$cur"))\n'
            + ("" if positional else files)
            + "            ;;\n"
        )
    return (
        '# bash completion for sluice: eval "$(sluice completion bash)"\n'
        "_sluice() {\n"
        '    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"\n'
        "    if [[ $COMP_CWORD -eq 1 ]]; then\n"
        f'        COMPREPLY=($(compgen -W "{" ".join(sorted(commands))} --help --version" '
        '-- "$cur"))\n'
        "        return\n"
        "    fi\n"
        '    case "${COMP_WORDS[1]}" in\n' + "".join(cases) + "    esac\n"
        "}\n"
        "complete -F _sluice sluice\n"
    )


def _zsh_escape(text: str) -> str:
    return text.replace("'", "'\\''").replace("[", "\\[").replace("]", "\\]").replace(":", "\\:")


def zsh(parser: argparse.ArgumentParser) -> str:
    commands = _commands(parser)
    described = []
    for name, sub in sorted(commands.items()):
        summary = (sub.description or "").split(".")[0] or name
        described.append(f"'{name}:{_zsh_escape(summary[:60])}'")
    cases = []
    for name, sub in sorted(commands.items()):
        choices = _choices(sub)
        specs = []
        for a in sub._actions:
            longs = [o for o in a.option_strings if o.startswith("--")]
            if not longs or a.dest == "help":
                continue
            takes_value = a.nargs != 0
            action = ""
            if takes_value:
                values = choices.get(longs[0])
                action = f":value:({' '.join(values)})" if values else ":value:_files"
            specs.append(f"'{longs[0]}[{_zsh_escape(a.help or '')}]{action}'")
        positional = next((v for k, v in choices.items() if not k.startswith("--")), None)
        if positional:
            specs.append(f"'1:value:({' '.join(positional)})'")
        elif name == "check":
            specs.append("'1:config file:_files'")
        cases.append(f"        {name}) _arguments {' '.join(specs)} ;;\n")
    return (
        "#compdef sluice\n"
        "# zsh completion for sluice: save as _sluice in a directory of $fpath\n"
        "_sluice() {\n"
        "    local state\n"
        "    _arguments '1:command:->command' '*::arg:->args'\n"
        '    case "$state" in\n'
        "    command)\n"
        f"        local -a commands=({' '.join(described)})\n"
        "        _describe command commands ;;\n"
        "    args)\n"
        '        case "$words[1]" in\n' + "".join(cases) + "        esac ;;\n"
        "    esac\n"
        "}\n"
        '_sluice "$@"\n'
    )


def script(shell: str, parser: argparse.ArgumentParser) -> str:
    if shell == "bash":
        return bash(parser)
    if shell == "zsh":
        return zsh(parser)
    raise ValueError(f"shell must be bash or zsh, got {shell!r}")
