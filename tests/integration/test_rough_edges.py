"""What a newcomer's trial hit, each run as the real command: a closed pipe, exit statuses,
``state check`` beside a running daemon, ``init`` for every kind of source, help for every
command and flag, the orphaned-source warning, dead letters' lines, ``transcode`` arguments,
the skip note for manifests, the docs that show commands, the demo run twice, and
``test.sh`` reinstalling only what changed."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import (
    DaemonProcess,
    dead_letters,
    free_port,
    movie_event,
    run_clean_until,
    run_tfrecordd,
    spool_drained,
    spool_file,
    wait_for,
    write_config,
)
from tfrecordd.cli import EXIT_BROKEN_PIPE, parser
from tfrecordd.cli.initcmd import FORMATS, kind, starter_sources
from tfrecordd.errors import EXIT_IN_USE, EXIT_OK, EXIT_USAGE
from tfrecordd.events import Lines
from tfrecordd.outputs.manifest import SUFFIX as MANIFEST_SUFFIX

ROOT = Path(__file__).resolve().parents[2]
EVENTS = 3000
BAD_LINES = {4: "{not json", 2601: "[also not an event"}
"""Line number → a bad line of the spool file, one in an early batch and one in a late one."""


def _spool_lines() -> list[str]:
    lines = [json.dumps(movie_event(i)) for i in range(EVENTS)]
    for number, bad in sorted(BAD_LINES.items()):
        lines.insert(number - 1, bad)
    return lines


@pytest.fixture(scope="module")
def output(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A daemon's run over one spool file of :data:`EVENTS` events and :data:`BAD_LINES`: its
    shards (with manifests) under ``shards/``, its state under ``state/``."""
    root = tmp_path_factory.mktemp("rough")
    config = write_config(root, output={"max_shard_records": 1000, "max_shard_age": "1s"})
    spool_file(root / "spool", "a.jsonl", _spool_lines())
    run_clean_until(config, lambda: spool_drained(root / "spool"))
    return root


def _shards(root: Path) -> list[str]:
    """What ``shards/*`` expands to in a shell: the shards and their manifests."""
    return sorted(str(p) for p in (root / "shards").iterdir() if not p.name.startswith("."))


def _closed_pipe(*args: str) -> subprocess.CompletedProcess[str]:
    """``tfrecordd ARGS`` writing into a pipe whose reader is gone before it writes a byte
    (what ``| head -1`` is, once head has its line)."""
    read, write = os.pipe()
    os.close(read)
    try:
        return subprocess.run(
            [sys.executable, "-m", "tfrecordd", *args],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write)


def test_a_closed_pipe_ends_every_command_quietly(output: Path) -> None:
    shards = [s for s in _shards(output) if not s.endswith(MANIFEST_SUFFIX)]
    config = str(output / "tfrecordd.toml")
    commands = [
        ["verify", *shards],
        ["verify", "--json", *shards],
        ["cat", *shards],
        ["transcode", *shards, "--to", "zlib", "--out", str(output / "piped")],
        ["check-config", config],
        ["plugins"],
        ["schema", "--config", config],
        ["init", "--source", "tcp", "--output", "-"],
        ["state", "check", "--config", config],
        ["--help"],
        ["verify", "--help"],
        ["--version"],
    ]
    for argv in commands:
        result = _closed_pipe(*argv)
        # argparse's --help and --version let a failed write pass, and exit 0.
        expected = EXIT_OK if argv[-1] in ("--help", "--version") else EXIT_BROKEN_PIPE
        assert result.returncode == expected, (argv, result.stderr)
        assert "Traceback" not in result.stderr, (argv, result.stderr)
        assert "BrokenPipe" not in result.stderr, (argv, result.stderr)
        assert "Exception ignored" not in result.stderr, (argv, result.stderr)


def test_a_pipe_to_head_gets_its_line_and_no_traceback(output: Path) -> None:
    shards = " ".join(s for s in _shards(output) if not s.endswith(MANIFEST_SUFFIX))
    result = subprocess.run(
        ["bash", "-c", f"set -o pipefail; {sys.executable} -m tfrecordd cat {shards} | head -1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert json.loads(result.stdout)["user"], result.stdout
    assert result.stderr == "", result.stderr
    assert result.returncode == EXIT_BROKEN_PIPE, "as `cat big | head -1` under pipefail"


def test_transcode_makes_its_output_directory(output: Path, tmp_path: Path) -> None:
    shards = [s for s in _shards(output) if not s.endswith(MANIFEST_SUFFIX)]
    out = tmp_path / "new" / "gz"
    result = run_tfrecordd("transcode", *shards, "--to", "gzip", "--out", str(out))
    assert result.returncode == EXIT_OK, result.stderr
    assert len(list(out.iterdir())) == len(shards)
    file = tmp_path / "file"
    file.write_text("")
    refused = run_tfrecordd("transcode", *shards, "--to", "gzip", "--out", str(file))
    assert refused.returncode == 73, refused.stderr
    assert "exists and is not a directory" in refused.stderr


def test_transcode_refuses_a_level_without_compression(output: Path, tmp_path: Path) -> None:
    shards = [s for s in _shards(output) if not s.endswith(MANIFEST_SUFFIX)]
    out = tmp_path / "none"
    result = run_tfrecordd("transcode", *shards, "--to", "none", "--level", "3", "--out", str(out))
    assert result.returncode == EXIT_USAGE, result.stderr
    assert "--level 3 with --to none" in result.stderr
    assert not out.exists(), "refused before anything is made"
    high = run_tfrecordd("transcode", *shards, "--to", "gzip", "--level", "99", "--out", str(out))
    assert high.returncode == EXIT_USAGE, high.stderr  # was a traceback and exit 1
    assert "--level 99: gzip level must be in -1..9, got 99" in high.stderr
    assert "Traceback" not in high.stderr
    fine = run_tfrecordd("transcode", *shards, "--to", "zstd", "--level", "3", "--out", str(out))
    assert fine.returncode == EXIT_OK, fine.stderr


def test_only_verify_says_a_skipped_manifest_is_checked(output: Path, tmp_path: Path) -> None:
    everything = _shards(output)
    manifests = [p for p in everything if p.endswith(MANIFEST_SUFFIX)]
    assert manifests
    verify = run_tfrecordd("verify", *everything)
    cat = run_tfrecordd("cat", "--limit", "1", *everything)
    unchecked = run_tfrecordd("verify", "--no-manifest", *everything)
    transcode = run_tfrecordd("transcode", *everything, "--to", "zlib", "--out", str(tmp_path))
    for m in manifests:
        assert f"skipping {m}: a manifest, checked with its shard" in verify.stderr
        for result in (cat, unchecked, transcode):
            assert f"skipping {m}: a manifest, not a shard (its shard " in result.stderr
    for result in (cat, unchecked, transcode):
        assert "checked" not in result.stderr, result.stderr


def test_verify_writes_progress_lines_off_a_terminal(output: Path, tmp_path: Path) -> None:
    """docs/operations.md: one line per finished file on stderr, results on stdout."""
    shards = [s for s in _shards(output) if not s.endswith(MANIFEST_SUFFIX)]
    result = run_tfrecordd("verify", *shards)
    assert result.returncode == EXIT_OK, result.stderr
    progress = [line for line in result.stderr.splitlines() if line.startswith("verify: ")]
    assert len(progress) == len(shards), result.stderr
    assert progress[-1].startswith(f"verify: {len(shards)}/{len(shards)} "), progress
    assert progress[0].endswith(" records")
    assert all(line.startswith("OK   ") for line in result.stdout.splitlines()[:-1])
    # Both streams on one file (2>&1): the stdout line per file is said once.
    log = tmp_path / "both.log"
    with log.open("w") as f:
        subprocess.run(
            [sys.executable, "-m", "tfrecordd", "verify", *shards],
            stdout=f,
            stderr=subprocess.STDOUT,
            timeout=120,
            check=True,
        )
    assert "verify: 1/" not in log.read_text()


def test_state_check_names_the_daemon_that_holds_the_state(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    d = DaemonProcess(config)
    try:
        d.wait_started()
        result = run_tfrecordd("state", "check", "--config", str(config))
        assert result.returncode == EXIT_IN_USE, result.stdout + result.stderr
        assert f"in use by tfrecordd pid {d.proc.pid}" in result.stdout
        assert "OK: the daemon can start" not in result.stdout
        assert result.stdout.splitlines()[-1].startswith("IN USE: ")
        assert d.proc.poll() is None, "the check touched nothing the daemon holds"
        assert d.stop() == 0, d.output()
    finally:
        d.kill()
    after = run_tfrecordd("state", "check", "--config", str(config))
    assert after.returncode == EXIT_OK, after.stdout + after.stderr
    assert "OK: the daemon can start on this state" in after.stdout
    assert "in use" not in after.stdout


def _kinds() -> list[tuple[str, str]]:
    kinds = [(s, "jsonl") for s in starter_sources()]
    return kinds + [("directory", f) for f in FORMATS if f != "jsonl"]


def test_init_writes_a_config_for_every_kind_of_source(tmp_path: Path) -> None:
    expected = {"directory", "tcp", "udp", "unix", "redis-stream"}
    assert expected <= set(starter_sources())
    seen: dict[str, tuple[str, str]] = {}
    for source, fmt in _kinds():
        config = tmp_path / f"{source}-{fmt}.toml"
        init = run_tfrecordd(
            "init", "--source", source, "--format", fmt, "--output", str(config), cwd=tmp_path
        )
        assert init.returncode == EXIT_OK, init.stderr
        check = run_tfrecordd("check-config", str(config))
        assert check.returncode == EXIT_OK, (source, fmt, check.stdout + check.stderr)
        data = tomllib.loads(config.read_text())
        state, listen = data["daemon"]["state_dir"], data["metrics"]["listen"]
        for other, (other_state, other_listen) in seen.items():
            assert state != other_state, f"{source} {fmt} shares state_dir with {other}"
            assert listen != other_listen, f"{source} {fmt} shares its metrics port with {other}"
            assert listen != "127.0.0.1:9464", "the daemon's own default stays free"
        seen[f"{source} {fmt}"] = (state, listen)
        assert f"metrics on {listen}" in init.stdout
        assert " nc " not in init.stdout, "Debian's netcat waits for the server to close"
    refused = run_tfrecordd("init", "--source", "tcp", "--format", "csv", "--output", "-")
    assert refused.returncode == EXIT_USAGE, refused.stderr


def _received(port: int) -> float:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return 0.0
    found = re.findall(r"^tfrecordd_events_received_total\{[^}]*\} (\S+)$", text, re.M)
    return sum(float(v) for v in found)


@pytest.mark.parametrize(
    ("source", "fmt", "listen"),
    [
        ("tcp", "jsonl", "7070"),
        ("udp", "jsonl", "7071"),
        ("unix", "jsonl", None),
        ("directory", "csv", None),
    ],
)
def test_the_starters_try_line_ends_and_delivers(
    tmp_path: Path, source: str, fmt: str, listen: str | None
) -> None:
    """The try-it line ``init`` prints ends by itself, with any netcat or none, and its event
    lands in the clicks dataset."""
    port = free_port()
    argv = ["init", "--source", source, "--format", fmt, "--metrics-listen", f"127.0.0.1:{port}"]
    init = run_tfrecordd(*argv, cwd=tmp_path)
    assert init.returncode == EXIT_OK, init.stderr
    config = tmp_path / "tfrecordd.toml"
    (try_it,) = [line for line in init.stdout.splitlines() if "try it:" in line]
    command = try_it.split("try it:", 1)[1].strip()
    if listen is not None:  # the plugin's fixed port, moved to one free in this test
        free = str(free_port())
        config.write_text(config.read_text().replace(listen, free))
        command = command.replace(listen, free)
    d = DaemonProcess(config)
    try:
        d.wait_started()
        sent = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=20)
        assert sent.returncode == 0, sent.stderr
        wait_for(lambda: _received(port) >= 1, timeout=30)
        assert d.stop() == 0, d.output()
    finally:
        d.kill()
    base = tmp_path / f"tfrecordd-{kind(source, fmt)}"
    shards = list((base / "shards" / "clicks").rglob("*.tfrecord.gz"))
    assert len(shards) == 1, d.output()
    assert not (base / "state" / "dead-letters.jsonl").exists(), d.output()


def _every_action(
    p: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.Action | None, argparse.ArgumentParser]]:
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield (*path, name), None, sub
                assert helps.get(name), f"{' '.join((*path, name))}: no help in the list"
                yield from _every_action(sub, (*path, name))
        else:
            yield path, action, p


def test_every_command_and_flag_has_help() -> None:
    missing = []
    for path, action, p in _every_action(parser("*")):
        where = " ".join(("tfrecordd", *path))
        if action is None:
            if not p.description:
                missing.append(f"{where} --help: no description")
        elif not action.help or action.help == argparse.SUPPRESS:
            missing.append(f"{where} {'/'.join(action.option_strings) or action.dest}: no help")
    assert not missing, missing


def test_the_run_help_says_what_run_does() -> None:
    result = run_tfrecordd("run", "--help")
    assert result.returncode == EXIT_OK
    assert "run the daemon" in result.stdout


def test_the_orphaned_source_warning_names_the_command(output: Path, tmp_path: Path) -> None:
    """A source removed from the config leaves its positions; every start says so, and how
    to forget them."""
    config = tmp_path / "moved.toml"
    text = (output / "tfrecordd.toml").read_text()
    before, rest = text.split("[[sources]]\n")
    udp = f'[[sources]]\nname = "udp"\ntype = "udp"\nlisten = "127.0.0.1:{free_port()}"\n'
    encoders = rest[rest.index("[encoders.movies]") :]
    config.write_text(before + udp + 'encoder = "movies"\n' + encoders)
    result = run_tfrecordd("state", "check", "--config", str(config))
    said = result.stdout + result.stderr
    assert "source 'spool' is no longer configured" in said, said
    assert "tfrecordd state forget-source spool --config" in said, said


def test_a_dead_letter_says_its_line(output: Path) -> None:
    """The file, the line and the byte: ``a.jsonl:line 4:1234`` (the byte offset stays last)."""
    lines = _spool_lines()
    letters = dead_letters(output / "state")
    assert [letter["raw"] for letter in letters] == list(BAD_LINES.values())
    for letter, number in zip(letters, BAD_LINES, strict=True):
        offset = sum(len(line.encode()) + 1 for line in lines[: number - 1])
        assert letter["where"] == f"a.jsonl:line {number}:{offset}"


def test_a_csv_dead_letter_says_the_line_its_record_starts_on(tmp_path: Path) -> None:
    """Lines as an editor numbers them: a quoted field's line end starts a line too."""
    config = write_config(
        tmp_path,
        source={"pattern": "*.csv", "format": "csv"},
        features={"id": "int64", "user": "bytes"},
        # Drained means acknowledged, and that waits for the shard's age cap: the default
        # minute is the helper's whole wait.
        output={"max_shard_age": "1s"},
    )
    rows = ["id,user", "1,ann", '2,"two\nlines"', "3,cid", "4,dan,extra", "5,eve"]
    spool_file(tmp_path / "spool", "a.csv", rows)
    run_clean_until(config, lambda: spool_drained(tmp_path / "spool"))
    (letter,) = dead_letters(tmp_path / "state")
    assert letter["raw"] == "4,dan,extra"
    offset = sum(len(row) + 1 for row in rows[:4])
    assert letter["where"] == f"a.csv:line 6:{offset}", letter


def test_line_numbers_asked_in_any_order() -> None:
    lines = Lines(b"a\nbb\nccc\n\nd\n", "f", 100, 10, line=7)
    assert lines.at(100) == "f:line 7:100"
    assert lines.at(105) == "f:line 9:105"
    assert lines.at(110) == "f:line 11:110"
    assert lines.at(102) == "f:line 8:102", "back to an earlier line: counted again"
    assert Lines(b"a\n", "f", 5, 10).at(5) == "f:5", "a line not known is not made up"


def test_the_docker_commands_agree() -> None:
    readme = (ROOT / "README.md").read_text()
    dockerfile = (ROOT / "Dockerfile").read_text()
    [block] = [b for b in re.findall(r"```sh\n(.*?)```", readme, re.S) if "docker run" in b]
    shown = [line for line in block.splitlines() if not line.startswith("docker build")]
    commented = [line.removeprefix("#   ") for line in dockerfile.splitlines()[:8]]
    for line in shown:
        command = line.split("  #")[0].rstrip()
        assert command in commented, f"README's {command!r} is not the Dockerfile's"


def test_the_units_documentation_is_installed() -> None:
    """Each file the unit's Documentation= names is one the install steps create."""
    unit = (ROOT / "systemd" / "tfrecordd.service").read_text()
    steps = (ROOT / "systemd" / "README.md").read_text()
    [docs] = re.findall(r"^Documentation=(.*)$", unit, re.M)
    files = [u.removeprefix("file://") for u in docs.split() if u.startswith("file://")]
    assert files, docs
    for path in files:
        assert re.search(rf"^install .* {re.escape(path)}$", steps, re.M), path


def test_the_readme_says_what_the_tests_need_where_it_runs_them() -> None:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("./scripts/test.sh      #")
    near = readme[start : start + 600]
    assert "gcc" in near, near
    assert "python3-dev" in near, near
    assert "tfrecordd[s3]'" not in readme, "not on an index: install from the clone"
    assert "pip install -e '.[s3]'" in readme


def _demo(root: Path, seconds: int) -> str:
    log = root / "demo.log"
    with log.open("wb") as out:
        subprocess.run(
            ["bash", str(root / "scripts" / "demo.sh")],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=os.environ | {"DEMO_SKIP_INSTALL": "1", "DEMO_SECONDS": str(seconds)},
            timeout=120,
            check=False,
        )
    return log.read_text(errors="replace")


def test_the_demo_run_twice_writes_each_run_once(tmp_path: Path) -> None:
    (tmp_path / "scripts").mkdir()
    (tmp_path / "config").mkdir()
    shutil.copy(ROOT / "scripts" / "demo.sh", tmp_path / "scripts" / "demo.sh")
    demo = (ROOT / "config" / "demo.toml").read_text()
    demo = demo.replace('listen = "127.0.0.1:9464"', f'listen = "127.0.0.1:{free_port()}"')
    (tmp_path / "config" / "demo.toml").write_text(demo)
    (tmp_path / ".venv").symlink_to(sys.prefix)
    for _ in range(2):
        said = _demo(tmp_path, 3)
        assert "tfrecordd exited with status 0" in said, said
        produced = int(re.findall(r"files produced: (\d+)", said)[-1])
        total = re.findall(r"total: (\d+) records", said)
        assert total == [str(produced * 2000)], said


def test_test_sh_installs_only_when_the_install_changed(tmp_path: Path) -> None:
    """scripts/test.sh with stand-ins for python3 and the .venv's tools, which log their
    calls: a clean clone installs, an unchanged one does not, a changed pyproject.toml does."""
    (tmp_path / "scripts").mkdir()
    shutil.copy(ROOT / "scripts" / "test.sh", tmp_path / "scripts" / "test.sh")
    for name in ("pyproject.toml", "setup.py"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / "daemon" / "tfrecordd").mkdir(parents=True)
    (tmp_path / "daemon" / "tfrecordd" / "_x.c").write_text("int x;\n")
    calls, bin_dir = tmp_path / "calls", tmp_path / "bin"
    bin_dir.mkdir()
    stub = f'#!/bin/sh\necho "$(basename "$0") $*" >> {calls}\n'
    venv = (
        stub
        + 'if [ "$1 $2" = "-m venv" ]; then mkdir -p .venv/bin; for t in python ruff mypy; do '
        + f"cp {bin_dir}/python3 .venv/bin/$t; done; fi\n"
    )
    (bin_dir / "python3").write_text(venv)
    (bin_dir / "python3").chmod(0o755)

    def run() -> list[str]:
        calls.write_text("")
        env = os.environ | {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
        env.pop("TFRECORDD_REINSTALL", None)
        subprocess.run(
            ["bash", "scripts/test.sh"],
            cwd=tmp_path,
            env=env,
            check=True,
            timeout=60,
            capture_output=True,
        )
        return [c for c in calls.read_text().splitlines() if "pip install" in c]

    assert len(run()) == 2, "a clean clone installs pip and the package"
    assert run() == [], "nothing changed: nothing installed"
    with (tmp_path / "pyproject.toml").open("a") as f:
        f.write("\n# changed\n")
    assert len(run()) == 2, "a changed pyproject.toml installs again"
    assert run() == []
    (tmp_path / "daemon" / "tfrecordd" / "_x.c").write_text("int y;\n")
    assert len(run()) == 2, "a changed C source is built again"


def test_exit_statuses_are_the_tables(output: Path, tmp_path: Path) -> None:
    """Statuses the commands give, against the README's rows for them."""
    missing = run_tfrecordd("verify", str(tmp_path / "nothing.tfrecord"))
    assert missing.returncode == 66, missing.stderr
    exists = tmp_path / "out"
    shards = [s for s in _shards(output) if not s.endswith(MANIFEST_SUFFIX)][:1]
    assert run_tfrecordd("transcode", *shards, "--to", "gzip", "--out", str(exists)).returncode == 0
    again = run_tfrecordd("transcode", *shards, "--to", "gzip", "--out", str(exists))
    assert again.returncode == 73, again.stderr
    assert "exists already" in again.stderr
    for a, b in itertools.combinations([missing.returncode, again.returncode], 2):
        assert a != b
