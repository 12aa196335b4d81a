#!/usr/bin/env bash
# The Redis Streams consumer benchmark (bench/redis_streams/redis_streams_bench.cc) on a
# redis-server of its own (persistence off, BENCH_REDIS_PORT), stopped by its pid at the end.
# Never the shared test servers: the bench deletes and rewrites its stream.
#
# Usage: bench/redis_streams/run.sh [redis_streams_bench flags...]
#          e.g. --messages 200000 --batch 256 --rounds 3
# Environment:
#   BENCH_REDIS_PORT=28611   BENCH_SKIP_BUILD=1 (use the existing binary)   JOBS=2
#   REDIS_SERVER=redis-server   BENCH_BIN=build/release/bench/redis_streams_bench
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PORT="${BENCH_REDIS_PORT:-28611}"
REDIS_SERVER="${REDIS_SERVER:-$(command -v redis-server)}"
BIN="${BENCH_BIN:-$ROOT/build/release/bench/redis_streams_bench}"
DIR="$(mktemp -d /tmp/idem-streams-bench.XXXXXX)"
PID=

cleanup() {
  if [ -n "$PID" ]; then
    kill "$PID" 2>/dev/null || true
    wait "$PID" 2>/dev/null || true
  fi
  rm -rf "$DIR"
}
trap cleanup EXIT

if [ -z "${BENCH_SKIP_BUILD:-}" ]; then
  (cd "$ROOT" && cmake --preset release >/dev/null)
  cmake --build "$ROOT/build/release" -j "${JOBS:-2}" --target redis_streams_bench
fi

if redis-cli -p "$PORT" ping >/dev/null 2>&1; then
  echo "bench/redis_streams: port $PORT is in use; set BENCH_REDIS_PORT" >&2
  exit 1
fi
"$REDIS_SERVER" --port "$PORT" --bind 127.0.0.1 --dir "$DIR" --save '' --appendonly no \
  --daemonize no --logfile "$DIR/redis.log" &
PID=$!
for _ in $(seq 1 100); do
  redis-cli -p "$PORT" ping 2>/dev/null | grep -q PONG && break
  sleep 0.1
done
redis-cli -p "$PORT" ping 2>/dev/null | grep -q PONG || {
  echo "bench/redis_streams: redis-server on port $PORT did not start" >&2
  cat "$DIR/redis.log" >&2
  exit 1
}

echo "== redis-server $("$REDIS_SERVER" --version | cut -d' ' -f3) on 127.0.0.1:$PORT, $(nproc) cores"
echo "\$ $BIN --redis 127.0.0.1:$PORT $*"
"$BIN" --redis "127.0.0.1:$PORT" "$@"
