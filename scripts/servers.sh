#!/usr/bin/env bash
# Starts (or stops) the servers the test suite needs, on loopback, as plain processes:
#   - Redis, one node                      127.0.0.1:${IDEM_REDIS_PORT:-26379}
#   - Redis Cluster, 3 masters + 3 replicas 127.0.0.1:${IDEM_CLUSTER_BASE:-27001}..+5
#   - PostgreSQL 15 (initdb/pg_ctl as the postgres user) 127.0.0.1:${IDEM_PG_PORT:-25432}
#   - nats-server with JetStream (store in DIR/nats)    127.0.0.1:${IDEM_NATS_PORT:-24222}
#
#   scripts/servers.sh start [DIR]   starts them, waits until each answers, and writes
#                                    DIR/env (export lines) for the tests to source
#   scripts/servers.sh stop [DIR]    stops every server started there, by its pid
#
# DIR defaults to /tmp/idem-servers. The tests read:
#   IDEM_TEST_REDIS           127.0.0.1:PORT
#   IDEM_TEST_REDIS_CLUSTER   127.0.0.1:P1,127.0.0.1:P2,... (every node, masters first)
#   IDEM_TEST_POSTGRES        postgres://postgres@127.0.0.1:PORT/idem_test
#   IDEM_TEST_NATS            nats://127.0.0.1:PORT
#   IDEM_REDIS_SERVER, IDEM_PG_BIN, IDEM_NATS_SERVER   where the binaries are (tests that start
#                             their own)
# A test that needs one of these and finds it unset fails; it does not skip.
set -euo pipefail
cmd=${1:-}
dir=${2:-/tmp/idem-servers}
redis_port=${IDEM_REDIS_PORT:-26379}
cluster_base=${IDEM_CLUSTER_BASE:-27001}
pg_port=${IDEM_PG_PORT:-25432}
pg_bin=${IDEM_PG_BIN:-/usr/lib/postgresql/15/bin}
redis_server=${IDEM_REDIS_SERVER:-$(command -v redis-server || echo /usr/bin/redis-server)}
nats_port=${IDEM_NATS_PORT:-24222}
nats_server=${IDEM_NATS_SERVER:-$(command -v nats-server || echo /usr/sbin/nats-server)}

alive() { # pid -> 0 if the process runs (a zombie does not)
  local s
  s=$(ps -o stat= -p "$1" 2>/dev/null | cut -c1) || return 1
  [ -n "$s" ] && [ "$s" != Z ]
}

stop_pid() { # pidfile
  [ -f "$1" ] || return 0
  local pid
  pid=$(cat "$1")
  if alive "$pid"; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do alive "$pid" || break; sleep 0.1; done
    alive "$pid" && kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$1"
}

stop_all() {
  for f in "$dir"/redis-*.pid; do [ -e "$f" ] && stop_pid "$f"; done
  if [ -f "$dir/pg/data/postmaster.pid" ]; then
    runuser -u postgres -- "$pg_bin/pg_ctl" -D "$dir/pg/data" -m immediate -w stop \
      >/dev/null 2>&1 || true
  fi
  [ -f "$dir/pg.pid" ] && stop_pid "$dir/pg.pid"
  [ -f "$dir/nats.pid" ] && stop_pid "$dir/nats.pid"
  return 0
}

wait_redis() { # port
  for _ in $(seq 1 100); do
    redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null | grep -q PONG && return 0
    sleep 0.1
  done
  echo "servers.sh: redis on port $1 did not start; its log:" >&2
  cat "$dir/redis-$1.log" >&2 || true
  return 1
}

port_in_use() { # port -> 0 if something listens on 127.0.0.1:port
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

start_redis() { # port [extra redis-server args...]
  local port=$1
  shift
  if port_in_use "$port"; then
    echo "servers.sh: port $port is in use (another run's servers?); set IDEM_REDIS_PORT /" \
      "IDEM_CLUSTER_BASE or stop them with scripts/servers.sh stop DIR" >&2
    return 1
  fi
  mkdir -p "$dir/redis-$port"
  "$redis_server" --port "$port" --bind 127.0.0.1 --dir "$dir/redis-$port" \
    --save '' --appendonly no --daemonize no --logfile "$dir/redis-$port.log" "$@" &
  echo $! >"$dir/redis-$port.pid"
  wait_redis "$port"
}

start_nats() {
  if port_in_use "$nats_port"; then
    echo "servers.sh: port $nats_port is in use; set IDEM_NATS_PORT" >&2
    return 1
  fi
  mkdir -p "$dir/nats"
  "$nats_server" -js -a 127.0.0.1 -p "$nats_port" -sd "$dir/nats" -l "$dir/nats.log" &
  echo $! >"$dir/nats.pid"
  # Ready once it accepts connections and has logged that it is (JetStream included).
  for _ in $(seq 1 100); do
    if port_in_use "$nats_port" && grep -q 'Server is ready' "$dir/nats.log" 2>/dev/null; then
      return 0
    fi
    alive "$(cat "$dir/nats.pid")" || break
    sleep 0.1
  done
  echo "servers.sh: nats-server on port $nats_port did not start; its log:" >&2
  cat "$dir/nats.log" >&2 || true
  return 1
}

start() {
  stop_all
  rm -rf "$dir"
  mkdir -p "$dir"

  # One Redis node.
  start_redis "$redis_port"

  # A Redis Cluster: 3 masters, each with one replica. A short node timeout so that a
  # failover after a killed master takes seconds, not the default 15 s.
  local nodes=()
  for i in 0 1 2 3 4 5; do
    local p=$((cluster_base + i))
    start_redis "$p" --cluster-enabled yes --cluster-config-file "$dir/redis-$p/nodes.conf" \
      --cluster-node-timeout 2000
    nodes+=("127.0.0.1:$p")
  done
  redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes \
    >"$dir/cluster-create.log" 2>&1 || {
    cat "$dir/cluster-create.log" >&2
    return 1
  }
  local ok=0
  for _ in $(seq 1 200); do
    ok=1
    for n in "${nodes[@]}"; do
      redis-cli -h 127.0.0.1 -p "${n#*:}" cluster info 2>/dev/null |
        grep -q 'cluster_state:ok' || ok=0
    done
    [ $ok = 1 ] && break
    sleep 0.1
  done
  [ $ok = 1 ] || { echo "servers.sh: the Redis Cluster did not reach state ok" >&2; return 1; }
  # Masters first (redis-cli assigned the first three as masters).
  local cluster_list
  cluster_list=$(IFS=,; echo "${nodes[*]}")

  # PostgreSQL, as the postgres user, in a directory it owns.
  if port_in_use "$pg_port"; then
    echo "servers.sh: port $pg_port is in use; set IDEM_PG_PORT" >&2
    return 1
  fi
  mkdir -p "$dir/pg"
  chown postgres "$dir/pg"
  runuser -u postgres -- "$pg_bin/initdb" -D "$dir/pg/data" -A trust -U postgres \
    >"$dir/pg-initdb.log" 2>&1 || { cat "$dir/pg-initdb.log" >&2; return 1; }
  runuser -u postgres -- "$pg_bin/pg_ctl" -D "$dir/pg/data" -l "$dir/pg/server.log" -w \
    -o "-p $pg_port -k $dir/pg -c listen_addresses=127.0.0.1 -c max_connections=300 -c fsync=off -c synchronous_commit=off -c full_page_writes=off" \
    start >/dev/null || { cat "$dir/pg/server.log" >&2; return 1; }
  head -1 "$dir/pg/data/postmaster.pid" >"$dir/pg.pid"
  "$pg_bin/psql" -h 127.0.0.1 -p "$pg_port" -U postgres -q -c 'CREATE DATABASE idem_test' \
    >/dev/null

  # NATS with JetStream, its store in DIR/nats.
  start_nats

  cat >"$dir/env" <<EOF
export IDEM_TEST_REDIS=127.0.0.1:$redis_port
export IDEM_TEST_REDIS_CLUSTER=$cluster_list
export IDEM_TEST_POSTGRES=postgres://postgres@127.0.0.1:$pg_port/idem_test
export IDEM_REDIS_SERVER=$redis_server
export IDEM_PG_BIN=$pg_bin
export IDEM_TEST_NATS=nats://127.0.0.1:$nats_port
export IDEM_NATS_SERVER=$nats_server
EOF
  echo "servers.sh: redis :$redis_port, cluster :$cluster_base-$((cluster_base + 5)), postgres :$pg_port, nats :$nats_port; env in $dir/env"
}

case "$cmd" in
  start) start ;;
  stop) stop_all ;;
  *)
    echo "usage: $0 start|stop [DIR]" >&2
    exit 2
    ;;
esac
