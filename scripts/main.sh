#!/usr/bin/env bash
# idem's main job: installs what it needs, builds a release, starts the example ledger (an HTTP
# API that records every charge) and idemd in front of it on the embedded log store
# (sync=always, no external server), then sends one charge twice with the same
# Idempotency-Key: the second answer is a replay and the ledger holds one charge.
# On a terminal it then keeps both running for you to try (Ctrl-C stops them); otherwise it
# stops them and exits 0 only if the demo showed exactly one charge.
#
# Ports: IDEMD_PORT (18080), IDEMD_ADMIN_PORT (18090), LEDGER_PORT (18000).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake --preset release >/dev/null
cmake --build --preset release --target idemd ledger idem_cli payments_stream

idemd_port=${IDEMD_PORT:-18080}
admin_port=${IDEMD_ADMIN_PORT:-18090}
ledger_port=${LEDGER_PORT:-18000}
bin=build/release
data=$(mktemp -d /tmp/idemd-demo.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$data"
}
trap cleanup EXIT

# Starts a server in the background and waits for its "listening on" line.
start() {
  local name=$1 log=$data/$1.log
  shift
  "$@" >"$data/$name.out" 2>"$log" &
  pids+=($!)
  for _ in $(seq 1 100); do
    grep -q "listening on" "$data/$name.out" 2>/dev/null && return 0
    # Gone, or a zombie (process 1 may not reap): it will not start.
    case "$(ps -o stat= -p "${pids[-1]}" 2>/dev/null | cut -c1)" in "" | Z) break ;; esac
    sleep 0.1
  done
  echo "$name did not start:" >&2
  cat "$log" >&2
  exit 1
}

start ledger "$bin/examples/ledger" --listen "127.0.0.1:$ledger_port"
start idemd "$bin/src/idemd/idemd" --listen "127.0.0.1:$idemd_port" \
  --admin "127.0.0.1:$admin_port" --upstream "http://127.0.0.1:$ledger_port" \
  --store "log:$data/store?sync=always"
echo "ledger on 127.0.0.1:$ledger_port; idemd on 127.0.0.1:$idemd_port (admin $admin_port), store $data/store"

key="demo-$(date +%s)-$RANDOM"
charge() {
  curl -sS -i -X POST "http://127.0.0.1:$idemd_port/charges" \
    -H "Idempotency-Key: $key" -H 'Content-Type: application/json' \
    -d '{"account":"acc-42","amount":1250}'
  echo
}
echo
echo "\$ curl -i -X POST http://127.0.0.1:$idemd_port/charges -H 'Idempotency-Key: $key' -d '{\"account\":\"acc-42\",\"amount\":1250}'"
charge
echo "\$ (the same request again: a client retry)"
second=$(charge)
echo "$second"
echo "\$ curl http://127.0.0.1:$ledger_port/charges/count   (the ledger itself, behind idemd)"
count=$(curl -sS "http://127.0.0.1:$ledger_port/charges/count")
echo "$count"
echo

ok=1
grep -qi '^Idempotent-Replayed: true' <<<"$second" || { echo "FAIL: the retry was not a replay"; ok=0; }
grep -q '"count":1' <<<"$count" || { echo "FAIL: the ledger does not hold exactly one charge"; ok=0; }
[ $ok = 1 ] && echo "OK: two requests, one charge; the retry was answered from idem's store."

if [ -t 0 ] && [ $ok = 1 ]; then
  echo
  echo "Both keep running. Try:  curl -i -X POST http://127.0.0.1:$idemd_port/charges -H 'Idempotency-Key: k1' -d '{\"account\":\"a\",\"amount\":1}'"
  echo "Metrics: curl http://127.0.0.1:$admin_port/metrics    Ctrl-C stops."
  wait
fi
[ $ok = 1 ]
