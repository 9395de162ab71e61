#!/usr/bin/env bash
# Builds the container image and runs it as users would: a spool file in, a shard out.
#
#   scripts/docker_smoke.sh
#
# Checks: the image builds; the daemon starts as uid 10001 on config/docker.toml; a JSON-lines
# file renamed into the spool volume becomes records (metrics on the published port); the
# HEALTHCHECK command passes; `docker stop` drains and exits 0 with the shard published;
# `tfrecordd verify` inside the image agrees with the shard and its manifest.
# Environment: DOCKER (default docker), DOCKERFILE (default ./Dockerfile), IMAGE (default
# tfrecordd:smoke), PORT (default 9464, published on 127.0.0.1), EVENTS (default 5000).
set -euo pipefail
cd "$(dirname "$0")/.."
DOCKER=${DOCKER:-docker}
DOCKERFILE=${DOCKERFILE:-Dockerfile}
IMAGE=${IMAGE:-tfrecordd:smoke}
PORT=${PORT:-9464}
EVENTS=${EVENTS:-5000}
NAME=tfrecordd-smoke-$$
WORK=$(mktemp -d)
cleanup() {
  "$DOCKER" rm -f "$NAME" >/dev/null 2>&1 || true
  # The volumes' files belong to uid 10001: removed from inside a container, as root there.
  "$DOCKER" run --rm --user 0 --entrypoint /bin/sh -v "$WORK:/w" "$IMAGE" -c 'rm -rf /w/*' \
    >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
fail() { echo "docker smoke: FAILED: $*" >&2; "$DOCKER" logs "$NAME" >&2 || true; exit 1; }

"$DOCKER" build -f "$DOCKERFILE" -t "$IMAGE" .
mkdir -p "$WORK/spool" "$WORK/data"
# As the image's own directories are: the daemon's user owns them.
chown 10001:10001 "$WORK/spool" "$WORK/data" 2>/dev/null ||
  chmod 0777 "$WORK/spool" "$WORK/data"

"$DOCKER" run -d --name "$NAME" --stop-timeout 60 -p "127.0.0.1:$PORT:9464" \
  -v "$WORK/spool:/var/spool/tfrecordd" -v "$WORK/data:/var/lib/tfrecordd" "$IMAGE" >/dev/null
for _ in $(seq 60); do
  "$DOCKER" logs "$NAME" 2>&1 | grep -q " started: " && break
  sleep 1
done
"$DOCKER" logs "$NAME" 2>&1 | grep -q " started: " || fail "the daemon did not start"
[ "$("$DOCKER" exec "$NAME" id -u)" = 10001 ] || fail "the daemon does not run as uid 10001"

python3 - "$WORK/spool/.events.jsonl" "$EVENTS" <<'EOF'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(int(sys.argv[2])):
        f.write(json.dumps({"user": f"u{i}", "age": i % 90, "movie": ["a", "b"],
                            "movie_ratings": [4.5, 3.0], "suggestion": "c",
                            "suggestion_purchased": 1.0, "purchase_price": 9.99}) + "\n")
EOF
chmod 0644 "$WORK/spool/.events.jsonl"
mv "$WORK/spool/.events.jsonl" "$WORK/spool/events.jsonl"

metric() {
  curl -fsS "http://127.0.0.1:$PORT/metrics" | awk -v m="$1" '$1 == m { print int($2) }'
}
written=0
for _ in $(seq 60); do
  written=$(metric tfrecordd_records_written_total || echo 0)
  [ "${written:-0}" -ge "$EVENTS" ] && break
  sleep 1
done
[ "${written:-0}" -eq "$EVENTS" ] || fail "records written: ${written:-none} of $EVENTS"
"$DOCKER" exec "$NAME" tfrecordd healthcheck >/dev/null || fail "the HEALTHCHECK command failed"

"$DOCKER" stop "$NAME" >/dev/null
code=$("$DOCKER" inspect --format '{{.State.ExitCode}}' "$NAME")
[ "$code" = 0 ] || fail "exit status $code after docker stop"
"$DOCKER" logs "$NAME" 2>&1 | grep -q "published part-" || fail "no shard published"
shards=$(find "$WORK/data/shards" -name 'part-*.tfrecord.gz' | wc -l)
[ "$shards" -ge 1 ] || fail "no shard in the data volume"
"$DOCKER" run --rm --entrypoint /bin/sh -v "$WORK/data:/var/lib/tfrecordd" "$IMAGE" \
  -c 'tfrecordd verify /var/lib/tfrecordd/shards/part-*.tfrecord.gz' ||
  fail "tfrecordd verify disagrees with the shards"
echo "docker smoke: OK ($EVENTS events, $shards shard(s), exit 0 after docker stop)"
