#!/usr/bin/env bash
# idem's main job: installs what it needs, builds a release, and runs the payment-stream
# example through the receiver on the embedded log store (sync=always, a fresh directory under
# /tmp; no external server).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake --preset release >/dev/null
cmake --build --preset release --target payments_stream
./build/release/examples/payments_stream --payments "${PAYMENTS:-20000}" --consumers 4
