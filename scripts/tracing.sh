#!/usr/bin/env bash
# The local trace backend: Jaeger v2 (built from its Go module by scripts/tools.sh) keeping
# traces in memory, for services run with OTEL_TRACES_EXPORTER=otlp (docs/tracing.md).
#
#   scripts/tracing.sh up       build Jaeger if missing, start it, wait until its API answers
#   scripts/tracing.sh status   where it listens; exits 1 when no Jaeger answers there
#   scripts/tracing.sh down     stop the Jaeger this script started (pid in .stack/pids); one
#                               started by another checkout on the same ports is left alone
#   scripts/tracing.sh env      the OTEL_* variables that point a service at it
#
# Ports (non-default, so another Jaeger or collector on the machine does not collide):
# OTLP HTTP 14318, OTLP gRPC 14317, query UI/API 16686 (gRPC 16685), health 14133; each can be
# changed with JAEGER_*_PORT. Traces live only as long as the process.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
STACK_DIR=${FLASHCOUPON_STACK_DIR:-$ROOT/.stack}
PID_FILE=$STACK_DIR/pids/jaeger.pid
LOG_FILE=$STACK_DIR/logs/jaeger.log
export JAEGER_HOST=${JAEGER_HOST:-127.0.0.1}
export JAEGER_OTLP_HTTP_PORT=${JAEGER_OTLP_HTTP_PORT:-14318}
export JAEGER_OTLP_GRPC_PORT=${JAEGER_OTLP_GRPC_PORT:-14317}
export JAEGER_QUERY_PORT=${JAEGER_QUERY_PORT:-16686}
export JAEGER_QUERY_GRPC_PORT=${JAEGER_QUERY_GRPC_PORT:-16685}
export JAEGER_HEALTH_PORT=${JAEGER_HEALTH_PORT:-14133}
export JAEGER_MAX_TRACES=${JAEGER_MAX_TRACES:-100000}
READY_TIMEOUT_S=${JAEGER_READY_TIMEOUT_S:-60}

log() { printf '[tracing %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { printf '[tracing] ERROR: %s\n' "$*" >&2; exit 1; }

running() { [ -f "$PID_FILE" ] && kill -0 "$(cat "$PID_FILE")" 2>/dev/null; }
api_ok() { curl -fs -o /dev/null --max-time 2 "http://$JAEGER_HOST:$JAEGER_QUERY_PORT/api/services"; }

cmd_up() {
  if api_ok; then # ours, or one another checkout of the project started on the same ports
    log "jaeger already answering on :$JAEGER_QUERY_PORT"
    return
  fi
  "$ROOT/scripts/tools.sh" install jaeger
  local bin
  bin=$("$ROOT/scripts/tools.sh" path jaeger)
  mkdir -p "$(dirname "$PID_FILE")" "$(dirname "$LOG_FILE")"
  nohup "$bin" --config "$ROOT/scripts/jaeger/config.yaml" >"$LOG_FILE" 2>&1 &
  echo $! >"$PID_FILE"
  local deadline=$((SECONDS + READY_TIMEOUT_S))
  until api_ok; do
    running || { tail -20 "$LOG_FILE" >&2; die "jaeger exited during start-up (log: $LOG_FILE)"; }
    [ $SECONDS -lt $deadline ] || die "jaeger API not answering after ${READY_TIMEOUT_S}s (log: $LOG_FILE)"
    sleep 0.2
  done
  log "jaeger up (pid $(cat "$PID_FILE")): UI http://$JAEGER_HOST:$JAEGER_QUERY_PORT, OTLP http://$JAEGER_HOST:$JAEGER_OTLP_HTTP_PORT"
}

cmd_status() {
  if api_ok; then
    local who="not started by this checkout"
    if running; then who="pid $(cat "$PID_FILE")"; fi
    printf 'Jaeger v2 (log: %s)\n  %s  UI/API http://%s:%s  OTLP HTTP :%s  OTLP gRPC :%s\n' \
      "$LOG_FILE" "$who" "$JAEGER_HOST" "$JAEGER_QUERY_PORT" \
      "$JAEGER_OTLP_HTTP_PORT" "$JAEGER_OTLP_GRPC_PORT"
    return 0
  fi
  echo "Jaeger: DOWN (scripts/tracing.sh up)"
  return 1
}

cmd_down() {
  [ -f "$PID_FILE" ] || return 0
  local pid i
  pid=$(cat "$PID_FILE")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for i in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null || true; fi
    log "stopped jaeger (pid $pid)"
  fi
  rm -f "$PID_FILE"
}

case "${1:-}" in
  up) cmd_up ;;
  status) cmd_status ;;
  down) cmd_down ;;
  env)
    echo "OTEL_TRACES_EXPORTER=otlp"
    echo "OTEL_EXPORTER_OTLP_ENDPOINT=http://$JAEGER_HOST:$JAEGER_OTLP_HTTP_PORT"
    ;;
  *) echo "usage: $0 up|status|down|env" >&2; exit 2 ;;
esac
