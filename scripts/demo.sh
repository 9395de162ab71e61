#!/usr/bin/env bash
# Install tfrecordd into .venv and run it on config/demo.toml: a producer drops JSON-lines files
# into demo/spool, and you watch gzip TFRecord shards appear in demo/shards. Ctrl-C stops it
# (SIGTERM: the daemon drains and publishes what is open). DEMO_SECONDS=N stops after N seconds;
# DEMO_SKIP_INSTALL=1 uses the .venv as it is. Each run starts from an empty demo/: see below.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${DEMO_SKIP_INSTALL:-}" ]; then
  python3 -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e .
fi
TFRECORDD=.venv/bin/tfrecordd
# The producer is seeded (the same events, under the same file names, on every run), so a run on
# the last run's state would write those events again as new inputs: the daemon's exactly-once
# is per input, and two spool files with equal lines are two inputs. So each run starts afresh,
# and what it shows is its own events only; unless a daemon runs on demo/state now.
in_use=0
"$TFRECORDD" state check --config config/demo.toml >/dev/null 2>&1 || in_use=$?
if [ "$in_use" = 75 ]; then
  "$TFRECORDD" state check --config config/demo.toml | grep "IN USE" >&2 || true
  echo "demo: a daemon runs on demo/state already: stop it first" >&2
  exit 75
fi
rm -rf demo/spool demo/shards demo/state
mkdir -p demo/spool demo/shards demo/state

"$TFRECORDD" check-config config/demo.toml
# Job control gives the daemon a process group of its own, so a terminal's Ctrl-C (SIGINT to the
# foreground group) reaches this script alone and stop() sends the daemon one SIGTERM. In the
# script's group the daemon would get SIGINT and then SIGTERM: a second signal, which exits at
# once instead of draining.
set -m
"$TFRECORDD" run --config config/demo.toml &
daemon=$!
set +m
producer=
stop() {
  # The daemon first: its drain is what Ctrl-C promises. The producer is killed outright (a
  # shell may put off a TERM until its child returns); a file it was writing is published by
  # rename or not at all.
  kill -TERM "$daemon" 2>/dev/null || true
  if [ -n "$producer" ]; then
    kill -KILL "$producer" 2>/dev/null || true
  fi
  status=0
  wait "$daemon" || status=$?
  echo
  echo "tfrecordd exited with status $status"
  echo "== published shards =="
  "$TFRECORDD" verify demo/shards/*.tfrecord.gz || true
  echo "== two examples =="
  "$TFRECORDD" cat --limit 2 demo/shards/*.tfrecord.gz || true
}
trap stop EXIT

produce() {  # one spool file of movie-recommendation events, published by rename
  .venv/bin/python - "$1" <<'PY'
import json, random, sys, os
n = int(sys.argv[1])
rng = random.Random(n)
movies = ["Alien", "Heat", "Up", "Jaws", "Brazil", "Ran", "Tron"]
path = f"demo/spool/events-{n:04d}.jsonl"
with open(f"demo/spool/.tmp-{n}", "w") as f:
    for i in range(2000):
        picks = rng.sample(movies, 3)
        f.write(json.dumps({
            "user": f"user-{rng.randrange(500)}", "age": rng.randrange(18, 80),
            "movie": picks, "movie_ratings": [round(rng.uniform(1, 5), 1) for _ in picks],
            "suggestion": rng.choice(movies), "suggestion_purchased": float(rng.random() < .2),
            "purchase_price": round(rng.uniform(2, 20), 2),
        }) + "\n")
os.rename(f"demo/spool/.tmp-{n}", path)
PY
}

produce_for_a_while() {
  end=$(( $(date +%s) + ${DEMO_SECONDS:-1000000000} ))
  n=0
  while [ "$(date +%s)" -lt "$end" ]; do
    produce "$n"
    n=$((n + 1))
    sleep 2
    echo "$(date +%T)  files produced: $n  shards published: $(find demo/shards -name '*.tfrecord.gz' 2>/dev/null | wc -l)"
  done
}

# The producer runs in the background (where Ctrl-C does not reach it) and the script waits for
# it: a signal with a trap ends the wait at once. Waiting on a foreground child instead, bash
# acts on Ctrl-C only if that child dies of it, and a child that handles it (a producer's
# python) left the script running. The EXIT trap stops the producer and drains the daemon.
produce_for_a_while &
producer=$!
trap 'exit 130' INT
trap 'exit 143' TERM
wait "$producer"
