#!/usr/bin/env bash
# The PostgreSQL store against pgbench, on a PostgreSQL 15 of this script's own: fsync=on,
# synchronous_commit=on (every commit waits for its WAL flush), its own port and data directory,
# stopped and removed at the end. Needs root (the server runs as the postgres user) and a release
# build (cmake --preset release && cmake --build build/release --target postgres_store_bench).
#
#   bench/postgres/run.sh            # 3 rounds of 10 s per contender
#   ROUNDS=5 SECONDS_PER_RUN=20 POOL_SIZE=4 bench/postgres/run.sh
#   BATCH=8 bench/postgres/run.sh    # the batch row with 8 keys a batch (default 100)
#   BUILD=/path bench/postgres/run.sh   # another build's binaries (bench/, src/cli/ below it)
#
# In one run, side by side on the same server:
#   pgbench     -c 32 -j 2 -M prepared, a script doing, per key (32 hex digits), INSERT ... ON
#               CONFLICT DO NOTHING and then an UPDATE storing a 100-byte response: two
#               transactions per key, as a hand-written idempotency table would.
#   idem        32 threads, each: Begin, then Complete with a 100-byte response (one key each).
#   idem batch  32 threads, each: BeginBatch of BATCH (100) keys, then CompleteBatch of them.
# in turn, ROUNDS times, and prints keys/s for each round, the medians and the ratios of the
# medians to pgbench's (targets: >= 1.0x and >= 5x).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${BUILD:-build/release}
pg_bin=${IDEM_PG_BIN:-/usr/lib/postgresql/15/bin}
port=${PORT:-28432}
seconds=${SECONDS_PER_RUN:-10}
rounds=${ROUNDS:-3}
clients=${CLIENTS:-32}
pool=${POOL_SIZE:-8}
batch=${BATCH:-100}
bench=$build/bench/postgres_store_bench
[ -x "$bench" ] || { echo "run.sh: build $bench first (release preset)" >&2; exit 2; }

dir=$(mktemp -d /tmp/idem-pg-bench.XXXXXX)
chown postgres "$dir"
stop() {
  runuser -u postgres -- "$pg_bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
  rm -rf "$dir"
}
trap stop EXIT
runuser -u postgres -- "$pg_bin/initdb" -D "$dir/data" -A trust -U postgres >"$dir/initdb.log"
runuser -u postgres -- "$pg_bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -o \
  "-p $port -k $dir -c listen_addresses=127.0.0.1 -c fsync=on -c synchronous_commit=on -c max_connections=200 -c shared_buffers=256MB -c max_wal_size=4GB" \
  start >/dev/null
sql() { "$pg_bin/psql" -h 127.0.0.1 -p "$port" -U postgres -qAt -v ON_ERROR_STOP=1 -c "$1" postgres; }
echo "server: PostgreSQL $(sql 'SHOW server_version'), fsync=$(sql 'SHOW fsync'), synchronous_commit=$(sql 'SHOW synchronous_commit'), port $port"
echo "machine: $(nproc) cores, $(uname -r)"

# pgbench's table and script: what one would write by hand.
sql "CREATE TABLE bench_kv (key text PRIMARY KEY, state smallint NOT NULL, response text)"
cat >"$dir/cycle.sql" <<'SQL'
\set n random(1, 9223372036854775806)
INSERT INTO bench_kv (key, state) VALUES (md5(:client_id::text || ':' || :n::text), 1) ON CONFLICT DO NOTHING;
UPDATE bench_kv SET state = 2, response = repeat('r', 100) WHERE key = md5(:client_id::text || ':' || :n::text);
SQL
url="postgres://postgres@127.0.0.1:$port/postgres?schema=idem&pool_size=$pool&reclaim_interval=0"
"$build/src/cli/idem" store init "$url" >/dev/null

run_pgbench() {
  sql CHECKPOINT
  "$pg_bin/pgbench" -h 127.0.0.1 -p "$port" -U postgres -n -M prepared -c "$clients" -j 2 \
    -T "$seconds" -f "$dir/cycle.sql" postgres 2>&1 |
    sed -n 's/^tps = \([0-9.]*\) .*/\1/p'
}
run_idem() { # extra args
  sql CHECKPOINT
  "$bench" "$url" --threads "$clients" --seconds "$seconds" "$@" | awk '{print $2}'
}
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# The three run in turn, `rounds` times, so that load from elsewhere on the machine drifts over
# all of them alike; the medians are compared.
echo "pgbench: -c $clients -j 2 -M prepared -T $seconds -f cycle.sql (INSERT ON CONFLICT DO NOTHING; UPDATE)"
echo "idem:    $clients threads, Begin + Complete (pool_size $pool)"
echo "batch:   $clients threads, BeginBatch + CompleteBatch of $batch (pool_size $pool)"
printf '%-6s %12s %12s %12s\n' round pgbench idem batch
: >"$dir/rates"
for r in $(seq 1 "$rounds"); do
  p=$(run_pgbench)
  i=$(run_idem --batch 0)
  b=$(run_idem --batch "$batch")
  printf '%-6s %12.0f %12.0f %12.0f\n' "$r" "$p" "$i" "$b"
  echo "$p $i $b" >>"$dir/rates"
done
p=$(awk '{print $1}' "$dir/rates" | median)
i=$(awk '{print $2}' "$dir/rates" | median)
b=$(awk '{print $3}' "$dir/rates" | median)
printf '%-6s %12.0f %12.0f %12.0f   keys/s\n' median "$p" "$i" "$b"
awk -v p="$p" -v i="$i" -v b="$b" -v n="$batch" 'BEGIN {
  printf "idem one call at a time  %.2fx pgbench (target >= 1.0x)\n", i / p
  printf "idem batches of %-8d %.2fx pgbench (target >= 5x at 100)\n", n, b / p }'
