#!/usr/bin/env bash
# The whole test suite, as CI runs it: installs what it needs, checks formatting, then builds
# and runs every test under ASan+UBSan and under TSan (warnings are errors), builds the release
# (benchmarks and examples, which run, but not the tests again) and checks that another CMake
# project can find_package(idem).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
jobs=${JOBS:-2}
summary=$(mktemp)
trap 'rm -f "$summary"' EXIT

echo "== clang-format"
scripts/format.sh --check

run_suite() {
  local preset=$1
  echo "== build $preset"
  cmake --preset "$preset" >/dev/null
  cmake --build "build/$preset" -j "$jobs"
  echo "== test $preset"
  ctest --test-dir "build/$preset" -j "$jobs" --output-on-failure --timeout 600 | tee -a "$summary"
}

# Redis (one node and a 3-master cluster), PostgreSQL and a JetStream nats-server on loopback,
# for the shared-store and broker tests; stopped by pid when this script exits, however it exits.
servers=$(mktemp -d /tmp/idem-servers.XXXXXX)
trap 'scripts/servers.sh stop "$servers"; rm -rf "$servers" "$summary"' EXIT
scripts/servers.sh start "$servers"
# shellcheck disable=SC1091
source "$servers/env"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}
run_suite ci-debug
run_suite ci-tsan

echo "== build ci-release (library, idemd, CLI, benchmarks, examples; no tests) and package check"
cmake --preset ci-release >/dev/null
cmake --build build/ci-release -j "$jobs"
ctest --test-dir build/ci-release -j "$jobs" --output-on-failure --timeout 600 -R example |
  tee -a "$summary"
prefix=$(mktemp -d)
trap 'scripts/servers.sh stop "$servers"; rm -rf "$servers" "$prefix" "$summary"' EXIT
cmake --install build/ci-release --prefix "$prefix" >/dev/null
cmake -S tests/package -B "$prefix/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build "$prefix/consumer" >/dev/null
"$prefix/consumer/idem_consumer"
echo "== all suites passed"
# One closing line over every ctest run above (ASan+UBSan, TSan, release examples). A ctest test
# is one GoogleTest test, or a whole binary of quick ones (idem_test's WHOLE).
total=$(sed -n 's/.*tests passed, 0 tests failed out of \([0-9]*\).*/\1/p' "$summary" |
  awk '{ n += $1 } END { print n }')
echo "${total} ctest tests passed, 0 failed"
