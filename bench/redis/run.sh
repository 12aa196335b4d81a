#!/usr/bin/env bash
# The Redis store benchmark (bench/redis/redis_store_bench.cc) on servers of its own: one
# redis-server (persistence off) on BENCH_REDIS_PORT, and with BENCH_CLUSTER=1 also a 3-master
# cluster on the three ports after it. Never the shared test servers: (c) runs FLUSHALL.
#
# Usage: bench/redis/run.sh [redis_store_bench flags...]   e.g. --threads 50 --seconds 5
# Environment:
#   BENCH_REDIS_PORT=28500   BENCH_CLUSTER=0|1   BENCH_SKIP_BUILD=1 (use the existing binary)
#   REDIS_SERVER=redis-server   BENCH_BIN=build/release/bench/redis_store_bench
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PORT="${BENCH_REDIS_PORT:-28500}"
REDIS_SERVER="${REDIS_SERVER:-$(command -v redis-server)}"
BIN="${BENCH_BIN:-$ROOT/build/release/bench/redis_store_bench}"
DIR="$(mktemp -d /tmp/idem-redis-bench.XXXXXX)"
PIDS=()

cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$DIR"
}
trap cleanup EXIT

start() { # port [args...]
  local port=$1
  shift
  mkdir -p "$DIR/$port"
  "$REDIS_SERVER" --port "$port" --bind 127.0.0.1 --dir "$DIR/$port" --save '' \
    --appendonly no --daemonize no --logfile "$DIR/$port.log" "$@" &
  PIDS+=($!)
  for _ in $(seq 1 100); do
    redis-cli -p "$port" ping 2>/dev/null | grep -q PONG && return 0
    sleep 0.1
  done
  echo "bench/redis: redis-server on port $port did not start" >&2
  cat "$DIR/$port.log" >&2
  exit 1
}

if [ -z "${BENCH_SKIP_BUILD:-}" ]; then
  cmake --preset release >/dev/null
  cmake --build "$ROOT/build/release" -j "${JOBS:-2}" --target redis_store_bench
fi

start "$PORT"
echo "== one node, 127.0.0.1:$PORT ($("$REDIS_SERVER" --version | cut -d' ' -f3))"
echo "\$ $BIN --redis 127.0.0.1:$PORT $*"
"$BIN" --redis "127.0.0.1:$PORT" "$@"

if [ "${BENCH_CLUSTER:-0}" = 1 ]; then
  nodes=()
  for i in 1 2 3; do
    p=$((PORT + i))
    start "$p" --cluster-enabled yes --cluster-config-file nodes.conf
    nodes+=("127.0.0.1:$p")
  done
  redis-cli --cluster create "${nodes[@]}" --cluster-yes >"$DIR/create.log" 2>&1
  for _ in $(seq 1 100); do
    ok=1
    for n in "${nodes[@]}"; do
      redis-cli -p "${n#*:}" cluster info | grep -q cluster_state:ok || ok=0
    done
    [ $ok = 1 ] && break
    sleep 0.1
  done
  list=$(IFS=,; echo "${nodes[*]}")
  echo "== cluster, 3 masters: $list"
  echo "\$ $BIN --redis $list --cluster $*"
  "$BIN" --redis "$list" --cluster "$@"
fi
