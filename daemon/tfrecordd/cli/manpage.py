"""The ``tfrecordd(1)`` man page (roff), generated from the CLI's own parser, and the files the
package carries under ``tfrecordd/share/``: the man page and the completion scripts.

``python -m tfrecordd.cli.manpage`` prints the man page; ``--write-share`` regenerates every
file under ``tfrecordd/share/`` (``tests/unit/test_cli_docs.py`` checks that they are current).
Every command gets a section with its description, its arguments and its options, each with
its help as ``--help`` gives it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tfrecordd.cli.completion import Command, Option, commands, render

__all__ = ["SHARE", "main", "render_manpage", "share_files", "write_share"]

SHARE = Path(__file__).resolve().parent.parent / "share"
"""Where the package carries the generated man page and completion scripts."""

_SEE_ALSO = (
    "The README (the command line, the exit statuses, a walkthrough), "
    "docs/config-reference.md (every config key) and docs/operations.md, in the source "
    "repository and its docs/ folder."
)


def _escape(text: str) -> str:
    """``text`` as roff text: backslashes and hyphens escaped, no line starting a request."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    text = "".join(ch if ch.isascii() else f"\\[u{ord(ch):04X}]" for ch in text)
    return "\\&" + text if text.startswith((".", "'")) else text


def _bold(text: str) -> str:
    return f"\\fB{_escape(text)}\\fR"


def _italic(text: str) -> str:
    return f"\\fI{_escape(text)}\\fR"


def _value(o: Option) -> str:
    if o.choices:
        return "{" + ",".join(o.choices) + "}"
    return o.metavar or ""


def _synopsis_item(o: Option) -> str:
    if not o.flags:
        value = _italic(_value(o))
        if o.many:
            value += " ..."
        return f"[{value}]" if o.optional else value
    item = _bold(o.flags[0])
    if o.metavar is not None:
        item += " " + _italic(_value(o)) + (" ..." if o.many else "")
    return f"[{item}]"


def _section(cmd: Command) -> list[str]:
    out = [f'.SS "{_escape(cmd.name)}"']
    usage = [_synopsis_item(o) for o in cmd.options if o.flags not in (("-h", "--help"),)]
    usage += [_synopsis_item(o) for o in cmd.positionals]
    if cmd.subcommands:
        usage.append(_italic("{" + ",".join(s.path[-1] for s in cmd.subcommands) + "}") + " ...")
    out += [_bold(cmd.name) + " " + " ".join(usage), ".PP", _escape(cmd.description)]
    for o in cmd.positionals:
        out += [".TP", _italic(_value(o)), _escape(o.help)]
    for o in cmd.options:
        if o.flags == ("-h", "--help"):
            continue
        head = ", ".join(_bold(f) for f in o.flags)
        if o.metavar is not None:
            head += " " + _italic(_value(o)) + (" ..." if o.many else "")
        out += [".TP", head, _escape(o.help or "(no help)")]
    return out


def render_manpage(root: Command | None = None) -> str:
    """The man page of ``tfrecordd`` and each of its commands."""
    root = root if root is not None else commands()
    out = [
        ".\\\" tfrecordd(1): generated from the CLI's parser by python -m tfrecordd.cli.manpage;",
        '.\\" do not edit.',
        '.TH TFRECORDD 1 "" "tfrecordd" "User Commands"',
        ".SH NAME",
        "tfrecordd \\- " + _escape(root.description),
        ".SH SYNOPSIS",
        _bold("tfrecordd") + " [" + _bold("--version") + "] " + _italic("COMMAND") + " ...",
        ".SH DESCRIPTION",
        _escape(
            "tfrecordd runs as a daemon (tfrecordd run) that reads events from its sources and "
            "writes them into TFRecord shards, each event exactly once, and its other commands "
            "check a config, inspect and convert shards, and look at a running daemon. "
            "tfrecordd COMMAND --help prints a command's help."
        ),
        ".SH COMMANDS",
    ]
    for cmd in root.subcommands:
        out.append(".TP")
        out.append(_bold(cmd.path[-1]))
        out.append(_escape(cmd.help))
    for cmd in root.subcommands:
        out += _section(cmd)
        for sub in cmd.subcommands:
            out += _section(sub)
    out += [".SH SEE ALSO", _escape(_SEE_ALSO)]
    return "\n".join(out) + "\n"


def share_files(root: Command | None = None) -> dict[str, str]:
    """Each file the package carries under :data:`SHARE` (its path there → its text)."""
    root = root if root is not None else commands()
    return {
        "man/man1/tfrecordd.1": render_manpage(root),
        "bash-completion/completions/tfrecordd": render("bash", root),
        "zsh/site-functions/_tfrecordd": render("zsh", root),
        "fish/vendor_completions.d/tfrecordd.fish": render("fish", root),
    }


def write_share(share: Path = SHARE) -> list[Path]:
    """Regenerate every file of :func:`share_files` under ``share``; returns their paths."""
    written = []
    for rel, text in share_files().items():
        path = share / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    """Print the man page, or (``--write-share``) regenerate every file under :data:`SHARE`."""
    cli = argparse.ArgumentParser(prog="python -m tfrecordd.cli.manpage")
    cli.add_argument("--write-share", action="store_true", help=f"regenerate {SHARE}/")
    if cli.parse_args(argv).write_share:
        for path in write_share():
            print(f"wrote {path}")
    else:
        sys.stdout.write(render_manpage())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
