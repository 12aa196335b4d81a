#!/usr/bin/env bash
# The NATS consumer benchmark (bench/nats/nats_consumer_bench.cc) on a nats-server of its own:
# JetStream on BENCH_NATS_PORT with its store in a temporary directory (removed at the end),
# stopped by its pid. Never the shared test server.
#
# Usage: bench/nats/run.sh [nats_consumer_bench flags...]   e.g. --messages 100000 --rounds 3
# Environment:
#   BENCH_NATS_PORT=28622   BENCH_SKIP_BUILD=1 (use the existing binary)
#   NATS_SERVER=nats-server   BENCH_BIN=build/release/bench/nats_consumer_bench
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PORT="${BENCH_NATS_PORT:-28622}"
NATS_SERVER="${NATS_SERVER:-$(command -v nats-server || echo /usr/sbin/nats-server)}"
BIN="${BENCH_BIN:-$ROOT/build/release/bench/nats_consumer_bench}"
DIR="$(mktemp -d /tmp/idem-nats-bench.XXXXXX)"
PID=

alive() { # pid -> 0 if the process runs (a zombie does not)
  local s
  s=$(ps -o stat= -p "$1" 2>/dev/null | cut -c1) || return 1
  [ -n "$s" ] && [ "$s" != Z ]
}

cleanup() {
  if [ -n "$PID" ] && alive "$PID"; then
    kill -TERM "$PID" 2>/dev/null || true
    for _ in $(seq 1 100); do alive "$PID" || break; sleep 0.1; done
    alive "$PID" && kill -KILL "$PID" 2>/dev/null || true
    wait "$PID" 2>/dev/null || true
  fi
  rm -rf "$DIR"
}
trap cleanup EXIT

if [ -z "${BENCH_SKIP_BUILD:-}" ]; then
  (cd "$ROOT" && cmake --preset release >/dev/null)
  cmake --build "$ROOT/build/release" -j "${JOBS:-2}" --target nats_consumer_bench
fi

if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
  echo "bench/nats: port $PORT is in use; set BENCH_NATS_PORT" >&2
  exit 1
fi
mkdir -p "$DIR/store"
"$NATS_SERVER" -js -a 127.0.0.1 -p "$PORT" -sd "$DIR/store" -l "$DIR/nats.log" &
PID=$!
for _ in $(seq 1 100); do
  grep -q 'Server is ready' "$DIR/nats.log" 2>/dev/null && break
  alive "$PID" || break
  sleep 0.1
done
grep -q 'Server is ready' "$DIR/nats.log" 2>/dev/null || {
  echo "bench/nats: nats-server did not start; its log:" >&2
  cat "$DIR/nats.log" >&2
  exit 1
}
echo "== nats-server $("$NATS_SERVER" --version | awk '{print $2}') on 127.0.0.1:$PORT (pid $PID), store $DIR/store"
echo "\$ $BIN --url nats://127.0.0.1:$PORT --dir $DIR $*"
"$BIN" --url "nats://127.0.0.1:$PORT" --dir "$DIR" "$@"
