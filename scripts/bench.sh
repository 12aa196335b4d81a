#!/usr/bin/env bash
# Builds the release and runs every benchmark side by side with its peer, 3 repetitions each,
# writing JSON to build/bench-results/. docs/benchmarks.md quotes the medians.
# IDEM_BENCH_KEYS (default 10000000) sets the memory-store key count.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake --preset release >/dev/null
cmake --build --preset release
out=build/bench-results
mkdir -p "$out"
for b in memory_store_bench fingerprint_bench metrics_bench; do
  echo "== $b"
  ./build/release/bench/$b --benchmark_repetitions=3 --benchmark_report_aggregates_only=true \
    --benchmark_out="$out/$b.json" --benchmark_out_format=json "$@"
done
