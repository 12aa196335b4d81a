#!/usr/bin/env bash
# The gateway benchmark: wrk against idemd and against nginx, side by side, in one run, with the
# same upstream (examples/ledger, POST /ping: no work, so the proxies' own cost shows).
#
#   (a) wrk -> nginx  proxy_pass, upstream keepalive 64       -> ledger     the baseline
#   (b) wrk -> idemd  memory store, a new key per request      -> ledger     target >= 0.9 x (a)
#   (c) wrk -> idemd  log store sync=always, a new key each    -> ledger     target >= 0.6 x (a)
#   (d) wrk -> idemd  memory store, 1000 completed keys reused (replays)     target >= 2 x (a)
#   (e) wrk -> idemd  log store sync=always, replays (for information)
#
# Usage: bench/gateway/run.sh           (from anywhere; builds the release preset first)
# Environment:
#   BENCH_DURATION=10s      each measured run        BENCH_WARMUP=2s   an unmeasured run before it
#   BENCH_CONNECTIONS=64    wrk -c                   BENCH_WRK_THREADS=1   wrk -t
#   BENCH_SCENARIOS="a b c d e"                      BENCH_SKIP_BUILD=1    use existing binaries
#   BENCH_WARM_PASS=3s      one pass that completes the replay keys (repeated until all are)
#   IDEMD_BIN, LEDGER_BIN   binaries (default build/release/...)
#   BENCH_IDEMD_ARGS        extra idemd flags        BENCH_OUT  result file
# Results: a table on stdout and in build/bench-results/gateway.txt; raw wrk output beside it.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
HERE="$ROOT/bench/gateway"
DURATION="${BENCH_DURATION:-10s}"
WARMUP="${BENCH_WARMUP:-2s}"
CONNECTIONS="${BENCH_CONNECTIONS:-64}"
WRK_THREADS="${BENCH_WRK_THREADS:-1}"
SCENARIOS="${BENCH_SCENARIOS:-a b c d e}"
REPLAY_KEYS="${BENCH_REPLAY_KEYS:-1000}"
IDEMD_BIN="${IDEMD_BIN:-$ROOT/build/release/src/idemd/idemd}"
LEDGER_BIN="${LEDGER_BIN:-$ROOT/build/release/examples/ledger}"
OUT="${BENCH_OUT:-$ROOT/build/bench-results/gateway.txt}"
RAW="${OUT%.txt}-raw.txt"
WARM_PASS="${BENCH_WARM_PASS:-3s}"
export BENCH_REPLAY_KEYS="$REPLAY_KEYS"
DEFAULT_BODY='{"account":"acc-bench","amount":1250}'
export BENCH_BODY="${BENCH_BODY:-$DEFAULT_BODY}"

die() {
  echo "bench/gateway: $*" >&2
  exit 1
}

for tool in wrk nginx curl awk; do
  command -v "$tool" > /dev/null || die "$tool not found (scripts/deps.sh installs it)"
done

if [[ "${BENCH_SKIP_BUILD:-0}" != 1 ]]; then
  (cd "$ROOT" && cmake --preset release > /dev/null &&
    cmake --build --preset release --target idemd ledger) || die "release build failed"
fi
[[ -x "$LEDGER_BIN" ]] || die "no ledger at $LEDGER_BIN"
needs_idemd=0
for s in $SCENARIOS; do [[ "$s" != a ]] && needs_idemd=1; done
if [[ $needs_idemd == 1 ]]; then
  [[ -x "$IDEMD_BIN" ]] || die "no idemd at $IDEMD_BIN"
fi

WORK="$(mktemp -d "${TMPDIR:-/tmp}/idem-bench-gateway.XXXXXX")"
PIDS=()
cleanup() {
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2> /dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2> /dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2> /dev/null || true
    wait "$pid" 2> /dev/null || true
  done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# start NAME CMD...: runs CMD in the background, stdout/stderr to $WORK/NAME.{out,err}.
start() {
  local name="$1"
  shift
  "$@" > "$WORK/$name.out" 2> "$WORK/$name.err" &
  LAST_PID=$!
  PIDS+=("$LAST_PID")
}

# stop PID: SIGTERM, wait up to 10 s, then SIGKILL; reaped.
stop() {
  local pid="$1" p keep=()
  kill -TERM "$pid" 2> /dev/null || true
  for _ in $(seq 100); do kill -0 "$pid" 2> /dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2> /dev/null || true
  wait "$pid" 2> /dev/null || true
  for p in "${PIDS[@]}"; do [[ "$p" != "$pid" ]] && keep+=("$p"); done
  PIDS=("${keep[@]+"${keep[@]}"}")
}

# alive NAME PID: fails loudly, with the process's stderr, if it has exited.
alive() {
  if ! kill -0 "$2" 2> /dev/null; then
    echo "bench/gateway: $1 (pid $2) died; its stderr:" >&2
    tail -n 40 "$WORK/$1.err" >&2 || true
    exit 1
  fi
}

# wait_line NAME PID PREFIX: waits (30 s) for a stdout line starting with PREFIX; prints it.
wait_line() {
  local name="$1" pid="$2" prefix="$3" line
  for _ in $(seq 300); do
    line="$(grep -m1 "^$prefix" "$WORK/$name.out" 2> /dev/null || true)"
    if [[ -n "$line" ]]; then
      echo "$line"
      return
    fi
    alive "$name" "$pid"
    sleep 0.1
  done
  die "$name did not print '$prefix' within 30 s; stderr: $(tail -n 20 "$WORK/$name.err")"
}

# port_after LINE WORD: the port of the HOST:PORT that follows WORD in LINE.
port_after() {
  awk -v word="$2" '{ for (i = 1; i < NF; i++) if ($i == word) { n = split($(i + 1), a, ":"); print a[n]; exit } }' <<< "$1"
}

# wait_http URL: until it answers 200 (30 s).
wait_http() {
  for _ in $(seq 300); do
    [[ "$(curl -s -o /dev/null -w '%{http_code}' "$1" || true)" == 200 ]] && return
    sleep 0.1
  done
  die "$1 never answered 200"
}

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2> /dev/null ||
    echo $((18000 + RANDOM % 1000))
}

# ---- the upstream ----
start ledger "$LEDGER_BIN" --listen 127.0.0.1:0 --threads 1
LEDGER_PID=$LAST_PID
LEDGER_LINE="$(wait_line ledger "$LEDGER_PID" 'ledger listening on ')"
LEDGER_PORT="$(port_after "$LEDGER_LINE" on)"
[[ -n "$LEDGER_PORT" ]] || die "cannot parse the ledger's ready line: $LEDGER_LINE"
wait_http "http://127.0.0.1:$LEDGER_PORT/healthz"

# ---- nginx ----
start_nginx() {
  local dir="$WORK/nginx" optional=""
  NGINX_PORT="$(free_port)"
  mkdir -p "$dir/tmp"
  # Modules a lighter nginx build may lack get no temp path.
  local configure
  configure="$(nginx -V 2>&1)"
  for m in fastcgi uwsgi scgi; do
    [[ "$configure" == *"--without-http_${m}_module"* ]] ||
      optional+="  ${m}_temp_path $dir/tmp/$m;"$'\n'
  done
  local user_line=""
  [[ "$(id -u)" == 0 ]] && user_line="user root;"
  cat > "$dir/nginx.conf" << EOF
$user_line
worker_processes 1;
pid $dir/nginx.pid;
error_log $dir/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path $dir/tmp/body;
  proxy_temp_path $dir/tmp/proxy;
$optional
  upstream ledger {
    server 127.0.0.1:$LEDGER_PORT;
    keepalive 64;
  }
  server {
    listen 127.0.0.1:$NGINX_PORT;
    location / {
      proxy_pass http://ledger;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
EOF
  start nginx nginx -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" -g 'daemon off;'
  NGINX_PID=$LAST_PID
  wait_http "http://127.0.0.1:$NGINX_PORT/healthz"
  alive nginx "$NGINX_PID"
}

# start_idemd STORE: sets IDEMD_PID, IDEMD_PORT, IDEMD_ADMIN_PORT.
start_idemd() {
  # shellcheck disable=SC2086  # BENCH_IDEMD_ARGS is a list of flags.
  start idemd "$IDEMD_BIN" --listen 127.0.0.1:0 --admin 127.0.0.1:0 \
    --upstream "http://127.0.0.1:$LEDGER_PORT" --store "$1" --threads 1 \
    --log-level warn ${BENCH_IDEMD_ARGS:-}  # no per-request log line: nginx runs access_log off
  IDEMD_PID=$LAST_PID
  local line
  line="$(wait_line idemd "$IDEMD_PID" 'idemd listening on ')"
  IDEMD_PORT="$(port_after "$line" on)"
  IDEMD_ADMIN_PORT="$(port_after "$line" admin)"
  [[ -n "$IDEMD_PORT" && -n "$IDEMD_ADMIN_PORT" ]] || die "cannot parse idemd's ready line: $line"
  wait_http "http://127.0.0.1:$IDEMD_ADMIN_PORT/healthz"
}

# run_wrk ID URL SCRIPT: a warm-up run, then the measured one; its output in $WORK/wrk-ID.txt.
run_wrk() {
  local id="$1" url="$2" script="$3"
  if [[ "$WARMUP" != 0 && "$WARMUP" != 0s ]]; then
    wrk -t"$WRK_THREADS" -c"$CONNECTIONS" -d"$WARMUP" -s "$script" "$url" > /dev/null
  fi
  wrk -t"$WRK_THREADS" -c"$CONNECTIONS" -d"$DURATION" --latency -s "$script" "$url" \
    > "$WORK/wrk-$id.txt"
  { echo "==== ($id) $url"; cat "$WORK/wrk-$id.txt"; } >> "$RAW"
}

# warm_replay_keys URL: completes every replay key once, one connection, so no two requests
# with one key overlap. wrk always runs for its whole -d, so this takes passes of
# BENCH_WARM_PASS until every key has answered 2xx once (completed keys then replay at once).
warm_replay_keys() {
  local out
  for _ in $(seq 20); do
    out="$(BENCH_WARM=1 wrk -t1 -c1 -d"$WARM_PASS" -s "$HERE/replay_keys.lua" "$1")"
    [[ "$out" == *"warm: ok"* ]] && break
    [[ "$out" == *"warm: incomplete"* ]] ||
      die "warming the replay keys failed: $(grep warm: <<< "$out")"
    alive idemd "$IDEMD_PID"
  done
  [[ "$out" == *"warm: ok"* ]] || die "the replay keys were not all completed after 20 passes"
  local replayed
  replayed="$(curl -s -D - -o /dev/null -X POST -H 'Content-Type: application/json' \
    -H 'Idempotency-Key: replay-1' --data "$BENCH_BODY" "$1" |
    tr -d '\r' | awk -F': *' 'tolower($1) == "idempotent-replayed" { print $2 }')"
  [[ "$replayed" == true ]] || die "a warmed key was not replayed (Idempotent-Replayed: '$replayed')"
}

mkdir -p "$(dirname "$OUT")"
: > "$RAW"
declare -A NAME RPS P50 P99 NON2XX
NAME[a]="nginx proxy_pass -> ledger"
NAME[b]="idemd memory, new keys -> ledger"
NAME[c]="idemd log sync=always, new keys -> ledger"
NAME[d]="idemd memory, replays (${REPLAY_KEYS} keys)"
NAME[e]="idemd log sync=always, replays"

record() {
  local id="$1" f="$WORK/wrk-$1.txt"
  RPS[$id]="$(awk '/^Requests\/sec:/ { print $2 }' "$f")"
  P50[$id]="$(awk '$1 == "50%" { print $2 }' "$f")"
  P99[$id]="$(awk '$1 == "99%" { print $2 }' "$f")"
  NON2XX[$id]="$(awk '/Non-2xx or 3xx responses:/ { print $NF }' "$f")"
  NON2XX[$id]="${NON2XX[$id]:-0}"
  local errors
  errors="$(awk '/Socket errors:/ { print }' "$f")"
  [[ -n "${RPS[$id]}" ]] || die "($id): no Requests/sec in wrk's output: $(cat "$f")"
  [[ -z "$errors" ]] && errors="no socket errors"
  echo "($id) ${NAME[$id]}: ${RPS[$id]} req/s, p50 ${P50[$id]}, p99 ${P99[$id]}, non-2xx ${NON2XX[$id]}, $errors" >&2
}

for s in $SCENARIOS; do
  case "$s" in
    a)
      start_nginx
      run_wrk a "http://127.0.0.1:$NGINX_PORT/ping" "$HERE/unique_key.lua"
      alive nginx "$NGINX_PID"
      stop "$NGINX_PID"
      ;;
    b | d)
      start_idemd memory:
      if [[ "$s" == b ]]; then
        run_wrk b "http://127.0.0.1:$IDEMD_PORT/ping" "$HERE/unique_key.lua"
      else
        warm_replay_keys "http://127.0.0.1:$IDEMD_PORT/ping"
        run_wrk d "http://127.0.0.1:$IDEMD_PORT/ping" "$HERE/replay_keys.lua"
      fi
      alive idemd "$IDEMD_PID"
      stop "$IDEMD_PID"
      ;;
    c | e)
      store_dir="$WORK/log-store-$s"
      mkdir -p "$store_dir"
      start_idemd "log:$store_dir?sync=always"
      if [[ "$s" == c ]]; then
        run_wrk c "http://127.0.0.1:$IDEMD_PORT/ping" "$HERE/unique_key.lua"
      else
        warm_replay_keys "http://127.0.0.1:$IDEMD_PORT/ping"
        run_wrk e "http://127.0.0.1:$IDEMD_PORT/ping" "$HERE/replay_keys.lua"
      fi
      alive idemd "$IDEMD_PID"
      stop "$IDEMD_PID"
      ;;
    *) die "unknown scenario '$s' (a b c d e)" ;;
  esac
  alive ledger "$LEDGER_PID"
  record "$s"
done

# ---- the table ----
ratio() { awk -v x="$1" -v y="$2" 'BEGIN { if (y > 0) printf "%.2f", x / y; else print "-" }'; }
target() {
  case "$1" in b) echo ">= 0.90" ;; c) echo ">= 0.60" ;; d) echo ">= 2.00" ;; *) echo "" ;; esac
}
{
  echo "idem gateway benchmark, $(date -u '+%Y-%m-%d %H:%M:%SZ'), $(git -C "$ROOT" rev-parse --short HEAD 2> /dev/null || echo '?')"
  echo "wrk -t$WRK_THREADS -c$CONNECTIONS -d$DURATION --latency (after a $WARMUP warm-up), POST /ping with a JSON body"
  echo "cores: $(nproc) (nproc), shared by wrk, the proxy under test and the ledger (1 thread); nothing pinned"
  echo "cpu: $(awk -F': ' '/^model name/ { print $2; exit }' /proc/cpuinfo)"
  echo "nginx: $(nginx -v 2>&1 | sed 's/^nginx version: //'), worker_processes 1, upstream keepalive 64; idemd --threads 1"
  echo
  printf '%-4s %-44s %12s %10s %10s %9s %8s %8s\n' "" "scenario" "requests/s" "p50" "p99" "non-2xx" "x (a)" "target"
  for s in $SCENARIOS; do
    r="-"
    [[ -n "${RPS[a]:-}" ]] && r="$(ratio "${RPS[$s]}" "${RPS[a]}")"
    printf '%-4s %-44s %12s %10s %10s %9s %8s %8s\n' "($s)" "${NAME[$s]}" "${RPS[$s]}" \
      "${P50[$s]}" "${P99[$s]}" "${NON2XX[$s]}" "$r" "$(target "$s")"
  done
  if [[ " $SCENARIOS " == *" c "* ]]; then
    # What bounds (c): every new key waits for two fdatasyncs (begin, then completion) before
    # its answer, so 64 connections can do at most 64 / (2 x sync latency) requests/s.
    echo
    python3 - "$WORK" "$CONNECTIONS" << 'PY'
import os, statistics, sys, time
path = os.path.join(sys.argv[1], "fsync-probe")
fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
lat = []
for _ in range(300):
    os.write(fd, b"x" * 64)
    t = time.perf_counter()
    os.fdatasync(fd)
    lat.append(time.perf_counter() - t)
os.close(fd)
os.unlink(path)
med = statistics.median(lat)
conns = int(sys.argv[2])
print(f"store disk: fdatasync of a 64-byte append, median {med * 1e3:.2f} ms over 300; with 2 syncs "
      f"per new key, {conns} connections are bounded by ~{conns / (2 * med):.0f} requests/s")
PY
  fi
  echo
  echo "raw wrk output: $RAW"
} | tee "$OUT"
