#!/usr/bin/env bash
# The benchmark suite in one command: prints the table and writes benchmarks/results/latest.md
# and latest.json. Options go to `python -m benchmarks.run` (--quick, --events N, --repeat K,
# --cases movies passthrough images sequence daemon, --no-tensorflow; --help lists them).
# PYTHON=/path/to/python picks the interpreter; by default the first of .venv and
# python3 that has tfrecordd and TensorFlow installed (else the first that has tfrecordd).
set -euo pipefail
cd "$(dirname "$0")/.."
has() { "$1" -c "import importlib.util as u, sys; sys.exit(not all(map(u.find_spec, sys.argv[1:])))" "${@:2}" 2>/dev/null; }
if [ -z "${PYTHON:-}" ]; then
  for want in "tfrecordd tensorflow" "tfrecordd"; do
    for candidate in .venv/bin/python python3; do
      # shellcheck disable=SC2086
      if command -v "$candidate" >/dev/null 2>&1 && has "$candidate" $want; then
        PYTHON=$candidate
        break 2
      fi
    done
  done
fi
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-3}
exec "${PYTHON:?no Python with tfrecordd installed found; set PYTHON}" -m benchmarks.run "$@"
