#!/usr/bin/env bash
# Installs what idem needs to build and test, from Debian 12's packages only.
# Idempotent: apt-get skips what is already there. Needs root (CI runs as root).
set -euo pipefail
packages=(
  build-essential g++ cmake ninja-build pkg-config git
  libssl-dev          # OpenSSL 3: SHA-256 (SHA-NI accelerated)
  libabsl-dev         # abseil: hashing and flat_hash_map
  libgtest-dev libgmock-dev   # GoogleTest
  libbenchmark-dev    # Google Benchmark
  librocksdb-dev libsqlite3-dev   # log_store_bench's peers
  clang clang-format  # libFuzzer targets, format check
  libboost1.81-dev    # Boost.Beast/Asio: idemd's HTTP server and upstream client
  libtomlplusplus-dev # idemd's TOML configuration
  libjemalloc-dev     # idemd's allocator (glibc malloc cost ~15% of its CPU)
  curl                # the main job's demo requests
  wrk nginx-light     # the gateway benchmark and its nginx peer
  libhiredis-dev redis-server redis-tools   # the Redis store (hiredis 0.14) and its tests
  libpq-dev postgresql-15 postgresql-client-15  # the PostgreSQL store (libpq 15), its tests, pgbench
  librdkafka-dev      # the Kafka consumer (librdkafka 2.0, and its mock cluster for tests)
  libnats-dev nats-server  # the NATS JetStream consumer (libnats 3.4) and its test server
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
