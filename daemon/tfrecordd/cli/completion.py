"""Shell completion for ``tfrecordd`` (bash, zsh, fish), generated from the CLI's own parser.

``tfrecordd completion bash|zsh|fish`` prints the script for the commands and plugins installed
here; the package also carries each one, generated from the same parser, under
``tfrecordd/share/`` beside the man page (:mod:`tfrecordd.cli.manpage`, whose
``--write-share`` regenerates them all; ``tests/unit/test_cli_docs.py`` checks that they are
current).

:func:`commands` reads the parser into :class:`Command` and :class:`Option` records, which the
man page is written from as well.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tfrecordd.cli import help_of
from tfrecordd.errors import EXIT_OK

__all__ = [
    "Command",
    "Option",
    "add_commands",
    "commands",
    "render",
]

_PATH_METAVARS = {"FILE", "PATH", "SRC", "INPUT", "DIR", "BASE"}
_PATH_DESTS = {"config", "config_option"}
"""Values that are paths whatever their metavar says."""
_DIR_METAVARS = {"DIR", "BASE"}
_MACHINE_DEFAULTS: dict[tuple[str, ...], str] = {("convert", "workers"): "the number of cores"}
"""Defaults that depend on the machine the parser is built on, as the generated files say them
(they are the same wherever they are generated)."""


@dataclass(frozen=True)
class Option:
    """An option or a positional argument of a command."""

    flags: tuple[str, ...]
    """``("--config", "-c")``; empty for a positional."""
    metavar: str | None
    """The value's name; ``None`` for a flag that takes none."""
    help: str
    choices: tuple[str, ...] = ()
    many: bool = False
    """Takes any number of values (``FILE...``)."""
    repeat: bool = False
    """An option given as often as wanted (``--partition P --partition Q``)."""
    optional: bool = False
    """A positional that may be left out."""

    @property
    def path(self) -> bool:
        """The value is a file or a directory (``DIR|URL``: may be)."""
        return bool(_PATH_METAVARS.intersection((self.metavar or "").split("|")))

    @property
    def directory(self) -> bool:
        return bool(_DIR_METAVARS.intersection((self.metavar or "").split("|")))


@dataclass
class Command:
    """A command (``()`` for ``tfrecordd`` itself), its options and its subcommands."""

    path: tuple[str, ...]
    help: str
    description: str
    options: list[Option] = field(default_factory=list)
    positionals: list[Option] = field(default_factory=list)
    subcommands: list[Command] = field(default_factory=list)

    @property
    def name(self) -> str:
        return " ".join(("tfrecordd", *self.path))


def _help(action: argparse.Action, where: tuple[str, ...], prog: str) -> str:
    text = action.help or ""
    override = _MACHINE_DEFAULTS.get((*where, action.dest))
    if override is not None:
        text = text.replace(", here %(default)s", "").replace("%(default)s", override)
    if "%" in text:
        # What argparse's HelpFormatter._expand_help substitutes.
        params = dict(vars(action), prog=prog)
        if action.choices is not None:
            params["choices"] = ", ".join(map(str, action.choices))
        text = text % params
    return " ".join(text.split())


def _command(p: argparse.ArgumentParser, path: tuple[str, ...], help: str) -> Command:
    cmd = Command(path, help, " ".join((p.description or help).split()))
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                cmd.subcommands.append(_command(sub, (*path, name), helps.get(name, "")))
            continue
        if action.help == argparse.SUPPRESS:
            continue
        choices = tuple(map(str, action.choices)) if action.choices is not None else ()
        takes = action.nargs != 0
        metavar = action.metavar if isinstance(action.metavar, str) else None
        if takes and metavar is None:
            metavar = action.dest.upper() if action.option_strings else action.dest
            if action.dest in _PATH_DESTS:
                metavar = "FILE"
        option = Option(
            flags=tuple(action.option_strings),
            metavar=metavar if takes else None,
            help=_help(action, path, p.prog),
            choices=choices,
            many=action.nargs in ("*", "+"),
            repeat=isinstance(action, argparse._AppendAction),
            optional=not action.option_strings and action.nargs in ("?", "*"),
        )
        (cmd.options if action.option_strings else cmd.positionals).append(option)
    return cmd


def commands() -> Command:
    """``tfrecordd`` and every command, read from :func:`tfrecordd.cli.parser` with every
    command's module loaded."""
    from tfrecordd.cli import parser

    p = parser("*")
    return _command(p, (), p.description or "")


def _walk(cmd: Command) -> Iterator[Command]:
    yield cmd
    for sub in cmd.subcommands:
        yield from _walk(sub)


# bash: one function, with a case per command for its words and its options' values.


_FILENAMES = "compopt -o filenames 2>/dev/null"
"""Paths proposed as paths: a directory gets its slash, a name with spaces its quoting."""


def _bash_words(words: list[str]) -> str:
    return " ".join(words)


def _bash(root: Command) -> str:
    out = [
        "# bash completion for tfrecordd: generated from its parser by",
        "# `tfrecordd completion bash`; do not edit.",
        "_tfrecordd() {",
        '    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"',
        '    local cmd="" subs="" opts="" i w',
        "    for ((i = 1; i < COMP_CWORD; i++)); do",
        '        w="${COMP_WORDS[i]}"',
        '        case "$cmd/$w" in',
    ]
    nested = [f"{' '.join(c.path)}/{s.path[-1]}" for c in _walk(root) for s in c.subcommands]
    out.append(f'            {"|".join(repr(n) for n in nested)}) cmd="${{cmd:+$cmd }}$w" ;;')
    out += ["        esac", "    done", '    case "$cmd" in']
    values: list[str] = []
    for cmd in _walk(root):
        key = " ".join(cmd.path)
        flags = [f for o in cmd.options for f in o.flags]
        subs = [s.path[-1] for s in cmd.subcommands]
        out.append(f"        {key!r}) subs={_bash_words(subs)!r} opts={_bash_words(flags)!r} ;;")
        for o in cmd.options:
            if o.metavar is None:
                continue
            pattern = "|".join(repr(f"{key}/{f}") for f in o.flags)
            if o.choices:
                words = _bash_words(list(o.choices))
                reply = f'COMPREPLY=($(compgen -W {words!r} -- "$cur")); return'
            elif o.path:
                kind = "-d" if o.directory else "-f"
                reply = f'{_FILENAMES}; COMPREPLY=($(compgen {kind} -- "$cur")); return'
            else:
                reply = "return"  # a value of its own: nothing to propose
            values.append(f"        {pattern}) {reply} ;;")
    out += ["    esac", '    case "$cmd/$prev" in', *values, "    esac"]
    out += [
        '    if [[ "$cur" == -* ]]; then',
        '        COMPREPLY=($(compgen -W "$opts" -- "$cur"))',
        '    elif [[ -n "$subs" ]]; then',
        '        COMPREPLY=($(compgen -W "$subs" -- "$cur"))',
        "    fi",
        "}",
        "complete -o bashdefault -o default -F _tfrecordd tfrecordd",
    ]
    return "\n".join(out) + "\n"


# zsh: a function per command, each an _arguments spec.


def _zsh_quote(text: str) -> str:
    return text.replace("'", "'\\''")


def _zsh_help(text: str) -> str:
    first = text.split(". ")[0].split("; ")[0]
    return _zsh_quote(first.replace("\\", "\\\\").replace("[", "\\[").replace("]", "\\]"))


def _zsh_action(o: Option) -> str:
    if o.choices:
        return "(" + " ".join(o.choices) + ")"
    if o.directory:
        return "_files -/"
    return "_files" if o.path else " "


def _zsh_func(cmd: Command) -> str:
    return "_tfrecordd" + "".join("_" + p.replace("-", "_") for p in cmd.path)


def _zsh_specs(cmd: Command) -> list[str]:
    specs = []
    for o in cmd.options:
        help = _zsh_help(o.help)
        arg = "" if o.metavar is None else f":{_zsh_quote(o.metavar)}:{_zsh_action(o)}"
        if o.flags in (("-h", "--help"), ("--version",)):
            exclusive = "(- *)"
        elif len(o.flags) > 1:
            exclusive = "(" + " ".join(o.flags) + ")"
        else:
            exclusive = ""
        star = "*" if o.repeat else ""
        if len(o.flags) > 1 and not star:
            specs.append(f"'{exclusive}'{{{','.join(o.flags)}}}'[{help}]{arg}'")
        else:
            specs += [f"'{star}{exclusive if not star else ''}{f}[{help}]{arg}'" for f in o.flags]
    for o in cmd.positionals:
        action = _zsh_action(o)
        lead = "*" if o.many else ":" if o.optional else ""
        specs.append(f"'{lead}:{_zsh_quote(o.metavar or '')}:{action}'")
    return specs


def _zsh(root: Command) -> str:
    out = [
        "#compdef tfrecordd",
        "# zsh completion for tfrecordd: generated from its parser by",
        "# `tfrecordd completion zsh`; do not edit.",
    ]
    for cmd in _walk(root):
        out += ["", f"{_zsh_func(cmd)}() {{"]
        specs = _zsh_specs(cmd)
        if not cmd.subcommands:
            out.append("    _arguments -s \\")
            out += [f"        {s} \\" for s in specs]
            out += ["        && return 0", "}"]
            continue
        out += ["    local curcontext=$curcontext state line", "    local -a subcommands"]
        out.append("    subcommands=(")
        for sub in cmd.subcommands:
            desc = _zsh_quote(sub.help.replace(":", "\\:"))
            out.append(f"        '{sub.path[-1]}:{desc}'")
        out += ["    )", "    _arguments -C -s \\"]
        out += [f"        {s} \\" for s in specs]
        out += ["        '1: :->command' \\", "        '*:: :->argument' && return 0"]
        out += ["    case $state in", "        command)"]
        out.append(f"            _describe -t commands '{cmd.name} command' subcommands ;;")
        out += ["        argument)", "            case $line[1] in"]
        for sub in cmd.subcommands:
            out.append(f"                {sub.path[-1]}) {_zsh_func(sub)} ;;")
        out += ["            esac ;;", "    esac", "}"]
    out += ["", '_tfrecordd "$@"']
    return "\n".join(out) + "\n"


# fish: one complete line per command and option, guarded by the command words seen.


def _fish_quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _fish_condition(cmd: Command, root: Command) -> str:
    if not cmd.path:
        return "__fish_use_subcommand"
    parts = [f"__fish_seen_subcommand_from {p}" for p in cmd.path]
    if cmd.subcommands:
        parts.append(
            "not __fish_seen_subcommand_from " + " ".join(s.path[-1] for s in cmd.subcommands)
        )
    return "; and ".join(parts)


def _fish(root: Command) -> str:
    out = [
        "# fish completion for tfrecordd: generated from its parser by",
        "# `tfrecordd completion fish`; do not edit.",
    ]
    for cmd in _walk(root):
        cond = _fish_quote(_fish_condition(cmd, root))
        for sub in cmd.subcommands:
            name, desc = sub.path[-1], _fish_quote(sub.help)
            out.append(f"complete -c tfrecordd -n {cond} -f -a {name} -d {desc}")
        for o in cmd.options:
            names = []
            for f in o.flags:
                names.append(f"-l {f[2:]}" if f.startswith("--") else f"-s {f[1:]}")
            arg = ""
            if o.choices:
                arg = " -x -a " + _fish_quote(" ".join(o.choices))
            elif o.metavar is not None:
                arg = " -r -F" if o.path else " -x"
            desc = _fish_quote(o.help.split(". ")[0])
            out.append(f"complete -c tfrecordd -n {cond} {' '.join(names)}{arg} -d {desc}")
    return "\n".join(out) + "\n"


_RENDERERS: dict[str, Callable[[Command], str]] = {"bash": _bash, "zsh": _zsh, "fish": _fish}


def render(shell: str, root: Command | None = None) -> str:
    """The completion script for ``shell`` (``bash``, ``zsh`` or ``fish``)."""
    return _RENDERERS[shell](root if root is not None else commands())


def _completion(args: argparse.Namespace) -> int:
    sys.stdout.write(render(args.shell))
    return EXIT_OK


def add_commands(sub: Any) -> None:
    """Register ``completion`` on the CLI's subparsers."""
    help = help_of("completion")
    p: argparse.ArgumentParser = sub.add_parser(
        "completion",
        help=help,
        description=help + ": e.g. `tfrecordd completion bash > "
        "~/.local/share/bash-completion/completions/tfrecordd`",
    )
    p.add_argument("shell", choices=sorted(_RENDERERS), help="the shell to complete in")
    p.set_defaults(func=_completion)
