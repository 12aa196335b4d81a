#!/usr/bin/env bash
# The Kafka consumer benchmark (bench/kafka/kafka_consumer_bench.cc): builds the release preset's
# kafka_consumer_bench only, then runs it. Needs no server: the mock cluster runs in the process.
#
# Usage: bench/kafka/run.sh [kafka_consumer_bench flags...]   e.g. --messages 200000 --rounds 3
# Environment: BENCH_SKIP_BUILD=1 (use the existing binary)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BIN="$ROOT/build/release/bench/kafka_consumer_bench"
if [ "${BENCH_SKIP_BUILD:-0}" != 1 ]; then
  cd "$ROOT"
  [ -f build/release/CMakeCache.txt ] || cmake --preset release >/dev/null
  cmake --build build/release -j2 --target kafka_consumer_bench
fi
exec "$BIN" "$@"
