"""The man page and the shell completion scripts the package carries: generated from the CLI's
own parser, checked in current (regenerate with ``python -m tfrecordd.cli.manpage
--write-share``), and each one working in its shell where that shell is installed."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support import run_tfrecordd
from tfrecordd.cli.completion import commands
from tfrecordd.cli.manpage import SHARE, share_files

REGENERATE = "python -m tfrecordd.cli.manpage --write-share"


def test_the_checked_in_files_are_what_the_parser_generates() -> None:
    files = share_files()
    stale = [rel for rel, text in files.items() if not (SHARE / rel).is_file()]
    stale += [
        rel for rel, text in files.items() if rel not in stale and (SHARE / rel).read_text() != text
    ]
    assert stale == [], f"stale under {SHARE}: {stale}; run `{REGENERATE}`"
    carried = sorted(str(p.relative_to(SHARE)) for p in SHARE.rglob("*") if p.is_file())
    assert carried == sorted(files)


def roff(text: str) -> str:
    return text.replace("-", "\\-")


def test_every_command_and_option_is_in_the_man_page_and_each_script() -> None:
    files = share_files()
    man = files["man/man1/tfrecordd.1"]
    root = commands()
    pending = [root]
    while pending:
        cmd = pending.pop()
        pending += cmd.subcommands
        if cmd.path:
            assert f'.SS "{roff(cmd.name)}"' in man
        for option in cmd.options:
            for flag in option.flags:
                if option.flags != ("-h", "--help"):  # every command has it: said once
                    assert f"\\fB{roff(flag)}\\fR" in man, (cmd.name, flag)
                assert flag in files["bash-completion/completions/tfrecordd"], (cmd.name, flag)
                assert flag in files["zsh/site-functions/_tfrecordd"], (cmd.name, flag)


def test_the_completion_command_prints_the_carried_scripts() -> None:
    for shell, rel in [
        ("bash", "bash-completion/completions/tfrecordd"),
        ("zsh", "zsh/site-functions/_tfrecordd"),
        ("fish", "fish/vendor_completions.d/tfrecordd.fish"),
    ]:
        done = run_tfrecordd("completion", shell)
        assert (done.returncode, done.stderr) == (0, "")
        assert done.stdout == (SHARE / rel).read_text()


def test_the_man_page_formats_without_a_warning() -> None:
    if shutil.which("groff") is None:
        pytest.skip("groff is not installed")
    done = subprocess.run(
        ["groff", "-man", "-Tutf8", "-ww", "-z", str(SHARE / "man/man1/tfrecordd.1")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert (done.returncode, done.stderr) == (0, "")


def bash_complete(*words: str) -> list[str]:
    """What the carried bash script proposes for the command line ``words`` (the last one being
    completed)."""
    script = SHARE / "bash-completion/completions/tfrecordd"
    array = " ".join(f"'{w}'" for w in words)
    program = (
        f"source {script}; COMP_WORDS=({array}); COMP_CWORD={len(words) - 1}; "
        "_tfrecordd; printf '%s\\n' \"${COMPREPLY[@]}\""
    )
    done = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", program],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.splitlines() if line]


def test_bash_completes_commands_options_and_values(tmp_path: Path) -> None:
    if shutil.which("bash") is None:
        pytest.skip("bash is not installed")
    assert bash_complete("tfrecordd", "sch") == ["schema"]
    assert bash_complete("tfrecordd", "schema", "--inf") == ["--infer"]
    assert bash_complete("tfrecordd", "schema", "--format", "") == [
        "python",
        "json",
        "jsonl",
        "csv",
    ]
    assert bash_complete("tfrecordd", "state", "re") == ["repair", "rename-source"]
    assert bash_complete("tfrecordd", "state", "repair", "--d") == ["--discard-checkpoint"]
    assert bash_complete("tfrecordd", "init", "--source", "u") == ["udp", "unix"]
    assert bash_complete("tfrecordd", "schema", "--sample", "") == []  # a number: nothing
    config = tmp_path / "tfrecordd.toml"
    config.touch()
    assert bash_complete("tfrecordd", "run", "--config", f"{tmp_path}/tfr") == [str(config)]


ZSH_SESSION = r"""
zmodload zsh/zpty
zpty z 'zsh -f -i'
drain() {  # what the shell wrote, once it has been quiet for 0.3 s (at most 10 s)
  local chunk quiet=0 i; REPLY=""
  for i in {1..100}; do
    if zpty -rt z chunk; then REPLY+=$chunk; quiet=0; else (( quiet++ )); fi
    [[ -n $REPLY && $quiet -ge 3 ]] && break
    sleep 0.1
  done
}
zpty -w z 'PS1="%% "; fpath=(FOLDER $fpath); autoload -Uz compinit; compinit -u; echo READY'
drain
for line in "$@"; do
  zpty -w -n z "$line"$'	'
  drain
  print -rn -- "${line} => ${REPLY}"$'\x1e'
  zpty -w -n z $'\C-e\C-u'
  drain
done
zpty -d z
"""


def test_zsh_completes_commands_options_and_values(tmp_path: Path) -> None:
    if shutil.which("zsh") is None:
        pytest.skip("zsh is not installed")
    script = SHARE / "zsh/site-functions/_tfrecordd"
    checked = subprocess.run(["zsh", "-n", str(script)], capture_output=True, text=True, timeout=30)
    assert (checked.returncode, checked.stderr) == (0, "")
    session = tmp_path / "session.zsh"
    session.write_text(ZSH_SESSION.replace("FOLDER", str(script.parent)))
    lines = [
        "tfrecordd sch",
        "tfrecordd schema --format ",
        "tfrecordd state re",
        "tfrecordd state repair --d",
    ]
    done = subprocess.run(
        ["zsh", "-f", str(session), *lines], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", done.stdout)  # the terminal's escapes
    got = dict(entry.split(" => ", 1) for entry in shown.split("\x1e") if " => " in entry)
    assert "tfrecordd schema " in got["tfrecordd sch"]
    assert all(w in got["tfrecordd schema --format "] for w in ("csv", "json", "python"))
    assert "rename-source" in got["tfrecordd state re"]
    assert "repair" in got["tfrecordd state re"]
    assert "--discard-checkpoint" in got["tfrecordd state repair --d"]


def test_fish_completes_commands_options_and_values() -> None:
    if shutil.which("fish") is None:
        pytest.skip("fish is not installed")
    script = SHARE / "fish/vendor_completions.d/tfrecordd.fish"

    def complete(line: str) -> list[str]:
        done = subprocess.run(
            ["fish", "--no-config", "-c", f"source {script}; complete -C {line!r}"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 0, done.stderr
        return [entry.split("\t")[0] for entry in done.stdout.splitlines()]

    assert complete("tfrecordd sch") == ["schema"]
    assert complete("tfrecordd schema --format ") == ["csv", "json", "jsonl", "python"]
    assert complete("tfrecordd state re") == ["rename-source", "repair"]
