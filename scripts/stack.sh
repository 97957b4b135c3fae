#!/usr/bin/env bash
# The local stack: Redis Cluster (3 masters + 3 replicas), Apache Kafka in KRaft mode and
# MariaDB, each on loopback ports of its own, state and logs under .stack/.
#
#   scripts/stack.sh install          system packages (apt), the Kafka jars (mvn): idempotent
#   scripts/stack.sh up [PART...]     install, start what is not running, wait for readiness
#   scripts/stack.sh status           what runs where; exits 1 when anything is unhealthy
#   scripts/stack.sh down [PART...]   stop only the processes this script started (recorded pids)
#   scripts/stack.sh reset            down, then wipe all state (data dirs, cluster config)
#   scripts/stack.sh env              the FLASHCOUPON_* variables that point services here
#
# PART is redis, kafka or mariadb (default: all three). Failure tests start private instances
# with their own FLASHCOUPON_STACK_DIR and ports (e.g. `KAFKA_BASE_PORT=29092 ... up kafka`)
# and stop those, never the shared stack.
#
# Ports and sizes come from the environment (defaults below), so a second stack can run
# beside the first. Everything binds to 127.0.0.1 unless FLASHCOUPON_STACK_HOST names another
# address of this machine (the dev Kubernetes cluster's stack binds to its bridge address, which
# pods reach and nothing outside the machine does; Redis and Kafka then announce that address).
# MYSQL_CLIENT_HOST is the MariaDB host pattern the project user may log in from, besides
# localhost (e.g. '10.244.0.%' for pods).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
STACK_DIR=${FLASHCOUPON_STACK_DIR:-$ROOT/.stack}
CACHE_DIR=${FLASHCOUPON_CACHE_DIR:-$ROOT/.cache}
LOG_DIR=$STACK_DIR/logs
PID_DIR=$STACK_DIR/pids

REDIS_BASE_PORT=${REDIS_BASE_PORT:-17000}
REDIS_NODES=${REDIS_NODES:-6}
REDIS_REPLICAS=${REDIS_REPLICAS:-1}
KAFKA_BROKERS=${KAFKA_BROKERS:-1}
KAFKA_BASE_PORT=${KAFKA_BASE_PORT:-19092}
KAFKA_CONTROLLER_BASE_PORT=${KAFKA_CONTROLLER_BASE_PORT:-19192}
KAFKA_HEAP=${KAFKA_HEAP:-768m}
# min.insync.replicas: 2 with 3 or more brokers (an acks=all write survives one broker's loss)
KAFKA_MIN_INSYNC=${KAFKA_MIN_INSYNC:-$((KAFKA_BROKERS >= 3 ? 2 : 1))}
# Optional second listener per broker, advertised at another port (a TCP proxy in front of it):
# broker i listens on KAFKA_PROXIED_BASE_PORT+i-1 and advertises KAFKA_PROXIED_ADVERTISED_BASE_PORT+i-1.
KAFKA_PROXIED_BASE_PORT=${KAFKA_PROXIED_BASE_PORT:-}
KAFKA_PROXIED_ADVERTISED_BASE_PORT=${KAFKA_PROXIED_ADVERTISED_BASE_PORT:-}
MYSQL_PORT=${MYSQL_PORT:-13306}
STACK_HOST=${FLASHCOUPON_STACK_HOST:-127.0.0.1}
MYSQL_CLIENT_HOST=${MYSQL_CLIENT_HOST:-127.0.0.1}
MYSQL_DATABASE=${MYSQL_DATABASE:-flashcoupon}
MYSQL_USER=${MYSQL_USER:-flashcoupon}
MYSQL_PASSWORD=${MYSQL_PASSWORD:-flashcoupon}

KAFKA_LIBS=$CACHE_DIR/kafka/libs
MYSQL_SOCKET=$STACK_DIR/mariadb/mysqld.sock

log() { printf '[stack %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { printf '[stack] ERROR: %s\n' "$*" >&2; exit 1; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
REUSED_DIR=$STACK_DIR/reused
# A server another checkout started, reused here: its pid (the process listening on the port,
# from ss) goes to reused/NAME.pid, which `down` never stops, so the demo's per-phase CPU
# still finds it (flashcoupon_loadtest.cpu_watch.stack_pids). Nothing is recorded without ss.
record_reused() { # name port
  local pid
  mkdir -p "$REUSED_DIR"
  pid=$(ss -ltnpH "sport = :$2" 2>/dev/null | sed -n 's/.*pid=\([0-9]*\).*/\1/p' | head -1) || true
  if [ -n "$pid" ]; then echo "$pid" >"$REUSED_DIR/$1.pid"; else rm -f "$REUSED_DIR/$1.pid"; fi
}
port_open() { (exec 3<>"/dev/tcp/$STACK_HOST/$1") 2>/dev/null; }

wait_for() { # seconds description command...
  local deadline=$((SECONDS + $1)) what=$2; shift 2
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.5
  done
  log "$what ready"
}

redis_ports() { seq "$REDIS_BASE_PORT" $((REDIS_BASE_PORT + REDIS_NODES - 1)); }
kafka_ids() { seq 1 "$KAFKA_BROKERS"; }

# ---------------------------------------------------------------- install

install_system() {
  local missing=()
  command -v redis-server >/dev/null || missing+=(redis-server)
  command -v redis-cli >/dev/null || missing+=(redis-tools)
  command -v mariadbd >/dev/null || missing+=(mariadb-server)
  command -v mariadb >/dev/null || missing+=(mariadb-client)
  command -v java >/dev/null || missing+=(openjdk-17-jre-headless)
  command -v mvn >/dev/null || missing+=(maven)
  # libfaketime: the chaos suite's clock-skew row runs one issuer with its clock off.
  compgen -G '/usr/lib/*/faketime/libfaketime.so.1' >/dev/null || missing+=(libfaketime)
  if [ ${#missing[@]} -gt 0 ]; then
    log "apt-get install ${missing[*]}"
    as_root apt-get update -qq
    # policy-rc.d keeps Debian from starting the system's own redis/mariadb services.
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

install_kafka() {
  if [ -f "$KAFKA_LIBS/.complete" ] && cmp -s "$ROOT/scripts/kafka/pom.xml" "$KAFKA_LIBS/.complete"; then
    return
  fi
  log "fetching Kafka jars from Maven Central into $KAFKA_LIBS"
  rm -rf "$KAFKA_LIBS"
  mkdir -p "$KAFKA_LIBS"
  mvn -q -B -f "$ROOT/scripts/kafka/pom.xml" -Dmaven.repo.local="$CACHE_DIR/m2" \
    dependency:copy-dependencies -DoutputDirectory="$KAFKA_LIBS" -DincludeScope=runtime
  cp "$ROOT/scripts/kafka/pom.xml" "$KAFKA_LIBS/.complete"
}

cmd_install() {
  local t0=$SECONDS
  install_system
  install_kafka
  log "install done in $((SECONDS - t0))s"
}

# ---------------------------------------------------------------- redis

redis_start() {
  local port dir
  for port in $(redis_ports); do
    dir=$STACK_DIR/redis/$port
    mkdir -p "$dir"
    if alive "$PID_DIR/redis-$port.pid"; then continue; fi
    if port_open "$port"; then
      # Another checkout's stack (or a manual start) already serves this port: use it, and
      # leave it alone on `down`, which only stops pids recorded here.
      redis-cli -h "$STACK_HOST" -p "$port" ping >/dev/null 2>&1 || die "port $port is taken by something that is not Redis"
      log "redis :$port already running (not started by this checkout); reusing it"
      record_reused "redis-$port" "$port"
      continue
    fi
    # No RDB/AOF: the local stack is disposable. Durability across node loss is what
    # replicas (and the issuer's WAIT setting) are for; that is what tests exercise.
    local announce=()
    [ "$STACK_HOST" = 127.0.0.1 ] || announce=(--cluster-announce-ip "$STACK_HOST")
    # SCHED_BATCH: a client's write does not preempt it mid-turn on a shared 2-core machine
    # (flashcoupon_loadtest.localrun.batch_scheduling says why, with the measurement).
    local sched=()
    command -v chrt >/dev/null && sched=(chrt -b 0)
    "${sched[@]}" redis-server --port "$port" --bind "$STACK_HOST" "${announce[@]}" --protected-mode no \
      --cluster-enabled yes --cluster-config-file "$dir/nodes.conf" \
      --cluster-node-timeout 3000 --dir "$dir" --save "" --appendonly no \
      --daemonize yes --pidfile "$PID_DIR/redis-$port.pid" --logfile "$LOG_DIR/redis-$port.log"
  done
  for port in $(redis_ports); do
    wait_for 20 "redis :$port" redis-cli -h "$STACK_HOST" -p "$port" ping || die "redis :$port did not answer; see $LOG_DIR/redis-$port.log"
  done
  local known
  known=$(redis-cli -h "$STACK_HOST" -p "$REDIS_BASE_PORT" cluster info | tr -d '\r' | awk -F: '$1=="cluster_known_nodes"{print $2}')
  if [ "$known" = 1 ]; then
    log "creating Redis Cluster ($REDIS_NODES nodes, $REDIS_REPLICAS replica(s) per master)"
    local addrs=()
    for port in $(redis_ports); do addrs+=("$STACK_HOST:$port"); done
    redis-cli --cluster create "${addrs[@]}" --cluster-replicas "$REDIS_REPLICAS" --cluster-yes >"$LOG_DIR/redis-cluster-create.log"
  fi
  wait_for 60 "redis cluster" redis_cluster_ok || die "cluster_state is not ok; see 'scripts/stack.sh status' (or 'reset')"
}

redis_cluster_ok() {
  local port
  for port in $(redis_ports); do
    redis-cli -h "$STACK_HOST" -p "$port" cluster info 2>/dev/null | tr -d '\r' | grep -q '^cluster_state:ok$' || return 1
    # A replica that has not finished its first sync cannot take over from its master
    # ("disconnected from master for longer than allowed"), so it is not ready yet.
    if redis-cli -h "$STACK_HOST" -p "$port" info replication | tr -d '\r' | grep -q '^role:slave$'; then
      redis-cli -h "$STACK_HOST" -p "$port" info replication | tr -d '\r' | grep -q '^master_link_status:up$' || return 1
    fi
  done
}

# ---------------------------------------------------------------- kafka

kafka_write_config() { # id
  local id=$1 voters="" i
  for i in $(kafka_ids); do
    voters="${voters:+$voters,}$i@$STACK_HOST:$((KAFKA_CONTROLLER_BASE_PORT + i - 1))"
  done
  local rf=$((KAFKA_BROKERS < 3 ? KAFKA_BROKERS : 3))
  local port=$((KAFKA_BASE_PORT + id - 1)) cport=$((KAFKA_CONTROLLER_BASE_PORT + id - 1))
  local listeners="PLAINTEXT://$STACK_HOST:$port,CONTROLLER://$STACK_HOST:$cport"
  local advertised="PLAINTEXT://$STACK_HOST:$port" protocols="PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
  if [ -n "$KAFKA_PROXIED_BASE_PORT" ]; then
    listeners="$listeners,PROXIED://$STACK_HOST:$((KAFKA_PROXIED_BASE_PORT + id - 1))"
    advertised="$advertised,PROXIED://$STACK_HOST:$((KAFKA_PROXIED_ADVERTISED_BASE_PORT + id - 1))"
    protocols="$protocols,PROXIED:PLAINTEXT"
  fi
  cat >"$STACK_DIR/kafka/$id/server.properties" <<EOF
process.roles=broker,controller
node.id=$id
controller.quorum.voters=$voters
listeners=$listeners
advertised.listeners=$advertised
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=$protocols
log.dirs=$STACK_DIR/kafka/$id/data
num.partitions=6
default.replication.factor=$rf
min.insync.replicas=$KAFKA_MIN_INSYNC
offsets.topic.replication.factor=$rf
offsets.topic.num.partitions=12
transaction.state.log.replication.factor=$rf
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
EOF
}

kafka_cmd() { # logfile: sets KAFKA_CMD, the JVM command line without its main class
  KAFKA_CMD=(java "-Xmx$KAFKA_HEAP" -Xms256m -XX:+UseG1GC -Djava.awt.headless=true
    "-Dlog4j2.configurationFile=$ROOT/scripts/kafka/log4j2.properties" "-Dkafka.logfile=$1"
    -cp "$KAFKA_LIBS/*")
}

kafka_start() {
  local id dir cluster_id
  mkdir -p "$STACK_DIR/kafka"
  if [ ! -f "$STACK_DIR/kafka/cluster.id" ]; then
    kafka_cmd "$LOG_DIR/kafka-tool.log"
    "${KAFKA_CMD[@]}" kafka.tools.StorageTool random-uuid >"$STACK_DIR/kafka/cluster.id"
  fi
  cluster_id=$(cat "$STACK_DIR/kafka/cluster.id")
  for id in $(kafka_ids); do
    dir=$STACK_DIR/kafka/$id
    mkdir -p "$dir"
    if alive "$PID_DIR/kafka-$id.pid"; then continue; fi
    if port_open $((KAFKA_BASE_PORT + id - 1)); then
      # Reused as is; the round-trip probe below tells whether it really is a working broker.
      log "kafka :$((KAFKA_BASE_PORT + id - 1)) already running (not started by this checkout); reusing it"
      record_reused "kafka-$id" $((KAFKA_BASE_PORT + id - 1))
      continue
    fi
    kafka_write_config "$id"
    if [ ! -f "$dir/data/meta.properties" ]; then
      kafka_cmd "$LOG_DIR/kafka-tool.log"
      "${KAFKA_CMD[@]}" kafka.tools.StorageTool format -t "$cluster_id" -c "$dir/server.properties" >/dev/null
    fi
    kafka_cmd "$LOG_DIR/kafka-$id.log"
    nohup "${KAFKA_CMD[@]}" kafka.Kafka "$dir/server.properties" >"$LOG_DIR/kafka-$id.out" 2>&1 &
    echo $! >"$PID_DIR/kafka-$id.pid"
  done
  for id in $(kafka_ids); do
    wait_for 60 "kafka broker $id :$((KAFKA_BASE_PORT + id - 1))" port_open $((KAFKA_BASE_PORT + id - 1)) \
      || die "kafka broker $id did not open its port; see $LOG_DIR/kafka-$id.log"
  done
  # A port accepting connections is not a working broker: create the project's topics and
  # round-trip a message through an idempotent producer before calling Kafka ready.
  (cd "$ROOT" && uv run --frozen python scripts/stack_probe.py kafka "$(kafka_bootstrap)") \
    || die "kafka round trip failed; see $LOG_DIR/kafka-1.log"
}

kafka_bootstrap() {
  local out="" id
  for id in $(kafka_ids); do out="${out:+$out,}$STACK_HOST:$((KAFKA_BASE_PORT + id - 1))"; done
  echo "$out"
}

# ---------------------------------------------------------------- mariadb

mysql_root() { mariadb --socket="$MYSQL_SOCKET" -uroot "$@"; }
mysql_tcp() { mariadb -h"$STACK_HOST" -P"$MYSQL_PORT" -u"$MYSQL_USER" -p"$MYSQL_PASSWORD" "$@"; }

mariadb_start() {
  local dir=$STACK_DIR/mariadb
  mkdir -p "$dir"
  if ! alive "$PID_DIR/mariadb.pid" && port_open "$MYSQL_PORT"; then
    mysql_tcp -e 'SELECT 1' >/dev/null 2>&1 \
      || die "port $MYSQL_PORT is taken by something that does not accept the project login"
    log "mariadb :$MYSQL_PORT already running (not started by this checkout); reusing it"
    record_reused mariadb "$MYSQL_PORT"
    return
  fi
  if ! alive "$PID_DIR/mariadb.pid"; then
    if [ ! -d "$dir/data/mysql" ]; then
      log "initialising MariaDB data directory"
      mariadb-install-db --no-defaults --datadir="$dir/data" --user="$(id -un)" \
        --auth-root-authentication-method=socket --skip-test-db >"$LOG_DIR/mariadb-install.log" 2>&1
    fi
    nohup mariadbd --no-defaults --datadir="$dir/data" --port="$MYSQL_PORT" --bind-address="$STACK_HOST" \
      --socket="$MYSQL_SOCKET" --pid-file="$dir/mariadbd.pid" --user="$(id -un)" \
      --log-error="$LOG_DIR/mariadb.log" --max-connections=500 --innodb-buffer-pool-size=512M \
      --character-set-server=utf8mb4 --collation-server=utf8mb4_bin --skip-name-resolve \
      >"$LOG_DIR/mariadb.out" 2>&1 &
    echo $! >"$PID_DIR/mariadb.pid"
  fi
  wait_for 60 "mariadb :$MYSQL_PORT" mysql_root -e 'SELECT 1' || die "mariadb did not answer; see $LOG_DIR/mariadb.log"
  mysql_root <<SQL
CREATE DATABASE IF NOT EXISTS \`$MYSQL_DATABASE\` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
CREATE USER IF NOT EXISTS '$MYSQL_USER'@'$MYSQL_CLIENT_HOST' IDENTIFIED BY '$MYSQL_PASSWORD';
CREATE USER IF NOT EXISTS '$MYSQL_USER'@'localhost' IDENTIFIED BY '$MYSQL_PASSWORD';
-- Tests create a database each (random names), so the project user may create databases.
GRANT ALL PRIVILEGES ON *.* TO '$MYSQL_USER'@'$MYSQL_CLIENT_HOST';
GRANT ALL PRIVILEGES ON *.* TO '$MYSQL_USER'@'localhost';
FLUSH PRIVILEGES;
SQL
  mysql_tcp -e 'SELECT 1' >/dev/null || die "mariadb login as $MYSQL_USER over TCP failed"
}

# ---------------------------------------------------------------- commands

wants() { # part parts...: is `part` among the requested parts (none requested = all)?
  local part=$1; shift
  [ $# -eq 0 ] && return 0
  local p
  for p in "$@"; do [ "$p" = "$part" ] && return 0; done
  return 1
}

check_parts() {
  local p
  for p in "$@"; do
    case $p in redis | kafka | mariadb) ;; *) die "unknown part '$p' (redis, kafka, mariadb)" ;; esac
  done
}

cmd_up() {
  local t0=$SECONDS
  check_parts "$@"
  cmd_install
  mkdir -p "$LOG_DIR" "$PID_DIR"
  if wants redis "$@"; then redis_start; fi
  if wants mariadb "$@"; then mariadb_start; fi
  if wants kafka "$@"; then kafka_start; fi
  log "up in $((SECONDS - t0))s"
  if [ $# -eq 0 ]; then cmd_status; fi
}

cmd_status() {
  local bad=0 port id info state role
  echo "Redis Cluster (logs: $LOG_DIR/redis-*.log)"
  for port in $(redis_ports); do
    if role=$(redis-cli -h "$STACK_HOST" -p "$port" role 2>/dev/null | head -1) && [ -n "$role" ]; then
      info=$(redis-cli -h "$STACK_HOST" -p "$port" cluster info | tr -d '\r')
      state=$(awk -F: '$1=="cluster_state"{print $2}' <<<"$info")
      printf '  %s:%s  %-6s  cluster_state:%s\n' "$STACK_HOST" "$port" "$role" "$state"
      [ "$state" = ok ] || bad=1
    else
      printf '  %s:%s  DOWN\n' "$STACK_HOST" "$port"
      bad=1
    fi
  done
  for port in $(redis_ports); do
    if redis-cli -h "$STACK_HOST" -p "$port" ping >/dev/null 2>&1; then
      local masters
      masters=$(redis-cli -h "$STACK_HOST" -p "$port" cluster nodes | awk '$3 ~ /master/ && $3 !~ /fail/ && $9 != "" {n++} END{print n+0}')
      printf '  masters serving slots: %s; failed nodes seen: %s\n' "$masters" \
        "$(redis-cli -h "$STACK_HOST" -p "$port" cluster nodes | awk '$3 ~ /fail/ {n++} END{print n+0}')"
      break
    fi
  done
  echo "Kafka KRaft (logs: $LOG_DIR/kafka-*.log)"
  for id in $(kafka_ids); do
    port=$((KAFKA_BASE_PORT + id - 1))
    if port_open "$port"; then
      if alive "$PID_DIR/kafka-$id.pid"; then
        printf '  broker %s  %s:%s  up (pid %s)\n' "$id" "$STACK_HOST" "$port" "$(cat "$PID_DIR/kafka-$id.pid")"
      else
        printf '  broker %s  %s:%s  up (not started by this checkout)\n' "$id" "$STACK_HOST" "$port"
      fi
    else
      printf '  broker %s  %s:%s  DOWN\n' "$id" "$STACK_HOST" "$port"
      bad=1
    fi
  done
  echo "MariaDB (log: $LOG_DIR/mariadb.log)"
  if mysql_tcp -e 'SELECT 1' >/dev/null 2>&1; then
    printf '  %s:%s  up  database=%s user=%s\n' "$STACK_HOST" "$MYSQL_PORT" "$MYSQL_DATABASE" "$MYSQL_USER"
  else
    printf '  %s:%s  DOWN\n' "$STACK_HOST" "$MYSQL_PORT"
    bad=1
  fi
  if [ $bad = 0 ]; then echo "stack: healthy"; else echo "stack: UNHEALTHY"; fi
  return $bad
}

stop_pid() { # pidfile name
  local pidfile=$1 name=$2 pid i
  [ -f "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for i in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null || true; fi
    log "stopped $name (pid $pid)"
  fi
  rm -f "$pidfile"
}

cmd_down() {
  local port id
  check_parts "$@"
  # A reused server is not ours to stop: only its record goes (the next `up` finds it again).
  if wants kafka "$@"; then
    for id in $(kafka_ids); do stop_pid "$PID_DIR/kafka-$id.pid" "kafka broker $id"; done
    rm -f "$REUSED_DIR"/kafka-*.pid
  fi
  if wants redis "$@"; then
    for port in $(redis_ports); do stop_pid "$PID_DIR/redis-$port.pid" "redis :$port"; done
    rm -f "$REUSED_DIR"/redis-*.pid
  fi
  if wants mariadb "$@"; then
    stop_pid "$PID_DIR/mariadb.pid" "mariadb"
    rm -f "$REUSED_DIR/mariadb.pid"
  fi
}

cmd_reset() {
  cmd_down
  rm -rf "$STACK_DIR/redis" "$STACK_DIR/kafka" "$STACK_DIR/mariadb"
  log "state wiped under $STACK_DIR"
}

case "${1:-}" in
  install) cmd_install ;;
  up) shift; cmd_up "$@" ;;
  status) cmd_status ;;
  down) shift; cmd_down "$@" ;;
  reset) cmd_reset ;;
  env)
    echo "FLASHCOUPON_REDIS_NODES=$(redis_ports | sed "s/^/$STACK_HOST:/" | paste -sd,)"
    echo "FLASHCOUPON_KAFKA_BOOTSTRAP=$(kafka_bootstrap)"
    echo "FLASHCOUPON_MYSQL_URL=mysql+asyncmy://$MYSQL_USER:$MYSQL_PASSWORD@$STACK_HOST:$MYSQL_PORT/$MYSQL_DATABASE"
    ;;
  *) echo "usage: $0 install|up [PART...]|status|down [PART...]|reset|env" >&2; exit 2 ;;
esac
