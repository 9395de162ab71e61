#!/usr/bin/env bash
# The benchmark suite in one command: prints the table and writes benchmarks/results/latest.md
# and latest.json. Options go to `python -m benchmarks.run` (--quick, --events N, --repeat K,
# --cases movies passthrough images sequence daemon, --no-tensorflow; --help lists them).
# PYTHON=/path/to/python picks the interpreter (default: .venv, then /work/venv, then python3).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
  for candidate in .venv/bin/python /work/venv/bin/python python3; do
    if command -v "$candidate" >/dev/null 2>&1; then PYTHON=$candidate; break; fi
  done
fi
export TF_CPP_MIN_LOG_LEVEL=${TF_CPP_MIN_LOG_LEVEL:-3}
exec "$PYTHON" -m benchmarks.run "$@"
