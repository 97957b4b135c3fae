#!/usr/bin/env bash
# The chart on the dev cluster, the production shape: the services in pods, the data stores
# outside the cluster as "managed" endpoints given through values (docs/deploy.md).
#
#   scripts/k8s-deploy.sh up       cluster + images (idempotent), the stores, helm upgrade --install --wait,
#                                  the dev Prometheus (k8s/dev/prometheus.yaml)
#   scripts/k8s-deploy.sh env      FLASHCOUPON_* for host-side tools (demo, tests) + KUBECONFIG,
#                                  GATEWAY_URL, PROMETHEUS_URL
#   scripts/k8s-deploy.sh down     helm uninstall, then stop the cluster's stores
#   scripts/k8s-deploy.sh stores-down   only stop the cluster's stores (make k8s-down)
#
# The stores are a second instance of scripts/stack.sh (state under .stack/k8s/stack, ports of
# its own) bound to the node address on the cluster's bridge: pods reach it through their
# gateway, Redis Cluster and Kafka announce it, and nothing outside this machine can reach it.
# The shared stack on 127.0.0.1 is never touched.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE_DIR=${FLASHCOUPON_CACHE_DIR:-$ROOT/.cache}
K8S_DIR=${FLASHCOUPON_K8S_DIR:-$ROOT/.stack/k8s}
RELEASE=${K8S_RELEASE:-flashcoupon}
NAMESPACE=${K8S_NAMESPACE:-flashcoupon}
NODE_PORT=30080
PROMETHEUS_NODE_PORT=30090
HELM=$CACHE_DIR/bin/helm

eval "$("$ROOT/scripts/k8s.sh" env | sed 's/^/export /')"
POD_NET=${K8S_NODE_IP%.*}.%

# The cluster's stores: the same script as the shared stack, another directory, other ports,
# the node address. Every port below 32768, outside the kernel's ephemeral range (32768-60999):
# a listener there can find its port taken by some connection's local end (Redis 37002's
# cluster bus, 47002, once failed to bind that way while the cluster's pods were connecting).
# Redis's bus port is its port + 10000, so Redis starts below 22768.
export FLASHCOUPON_STACK_DIR=$K8S_DIR/stack
export FLASHCOUPON_STACK_HOST=$K8S_NODE_IP
export REDIS_BASE_PORT=${K8S_REDIS_BASE_PORT:-18000}
export KAFKA_BASE_PORT=${K8S_KAFKA_BASE_PORT:-18092}
export KAFKA_CONTROLLER_BASE_PORT=${K8S_KAFKA_CONTROLLER_BASE_PORT:-18192}
export MYSQL_PORT=${K8S_MYSQL_PORT:-23306}
export MYSQL_CLIENT_HOST=$POD_NET

log() { printf '[k8s-deploy %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { printf '[k8s-deploy] ERROR: %s\n' "$*" >&2; exit 1; }
kc() { "$K8S_BIN/kubectl" "$@"; }

store_env() { "$ROOT/scripts/stack.sh" env; }

# One HS256 key per cluster, kept with its state: the chart gets it, and so do the drivers that
# mint shoppers' tokens.
jwt_secret() {
  [ -f "$K8S_DIR/jwt-secret" ] || (umask 077; openssl rand -hex 32 >"$K8S_DIR/jwt-secret")
  cat "$K8S_DIR/jwt-secret"
}

cmd_env() {
  store_env
  echo "FLASHCOUPON_GATEWAY_JWT_SECRET=$(jwt_secret)"
  echo "KUBECONFIG=$KUBECONFIG"
  echo "K8S_BIN=$K8S_BIN"
  echo "K8S_CONTAINERD_SOCK=$K8S_CONTAINERD_SOCK"
  echo "K8S_NAMESPACE=$NAMESPACE"
  echo "K8S_RELEASE=$RELEASE"
  echo "GATEWAY_URL=http://127.0.0.1:$NODE_PORT"
  echo "PROMETHEUS_URL=http://127.0.0.1:$PROMETHEUS_NODE_PORT"
}

cmd_up() {
  local t0=$SECONDS t tag
  "$ROOT/scripts/k8s.sh" up
  "$ROOT/scripts/k8s-images.sh" build
  tag=$("$ROOT/scripts/k8s-images.sh" tag)
  t=$SECONDS
  "$ROOT/scripts/stack.sh" up
  log "stores up on $K8S_NODE_IP in $((SECONDS - t))s"
  "$ROOT/scripts/tools.sh" install
  local -A env
  while IFS='=' read -r k v; do env[$k]=$v; done < <(store_env)
  t=$SECONDS
  log "helm upgrade --install $RELEASE (images $tag) --wait"
  "$HELM" upgrade --install "$RELEASE" "$ROOT/charts/flashcoupon" \
    --kubeconfig "$KUBECONFIG" --namespace "$NAMESPACE" --create-namespace \
    --wait --timeout 10m -f "$ROOT/k8s/dev/values.yaml" \
    --set "images.tag=$tag" \
    --set-string "redis.nodes=${env[FLASHCOUPON_REDIS_NODES]//,/\\,}" \
    --set-string "kafka.bootstrap=${env[FLASHCOUPON_KAFKA_BOOTSTRAP]//,/\\,}" \
    --set-string "mysql.url=${env[FLASHCOUPON_MYSQL_URL]}" \
    --set-string "gateway.auth.jwtSecret=$(jwt_secret)"
  log "release $RELEASE ready in $((SECONDS - t))s"
  kc -n "$NAMESPACE" apply -f "$ROOT/k8s/dev/gateway-nodeport.yaml" >/dev/null
  local deadline=$((SECONDS + 60))
  until curl -sf "http://127.0.0.1:$NODE_PORT/readyz" >/dev/null; do
    [ $SECONDS -lt $deadline ] || die "the gateway does not answer on 127.0.0.1:$NODE_PORT/readyz"
    sleep 0.5
  done
  up_prometheus
  kc -n "$NAMESPACE" get pods -o wide
  log "deployed in $((SECONDS - t0))s; gateway at http://127.0.0.1:$NODE_PORT," \
    "Prometheus at http://127.0.0.1:$PROMETHEUS_NODE_PORT"
}

# The dev Prometheus (docs/deploy.md, "Prometheus in the dev cluster"): the operator makes its
# StatefulSet; ready once it answers on the NodePort.
up_prometheus() {
  local t=$SECONDS
  kc apply -f "$ROOT/k8s/dev/prometheus.yaml" >/dev/null
  local deadline=$((SECONDS + 180))
  until curl -sf "http://127.0.0.1:$PROMETHEUS_NODE_PORT/-/ready" >/dev/null; do
    if [ $SECONDS -ge $deadline ]; then
      kc -n monitoring get prometheus,statefulsets,pods -o wide >&2 || true
      die "Prometheus does not answer on 127.0.0.1:$PROMETHEUS_NODE_PORT/-/ready"
    fi
    sleep 1
  done
  log "Prometheus ready in $((SECONDS - t))s"
}

cmd_down() {
  if [ -x "$HELM" ] && "$ROOT/scripts/k8s.sh" status >/dev/null 2>&1; then
    "$HELM" uninstall "$RELEASE" --kubeconfig "$KUBECONFIG" --namespace "$NAMESPACE" --wait || true
  fi
  "$ROOT/scripts/stack.sh" down
}

case "${1:-}" in
  up) cmd_up ;;
  env) cmd_env ;;
  down) cmd_down ;;
  stores-down) "$ROOT/scripts/stack.sh" down ;;
  *) echo "usage: $0 up|env|down|stores-down" >&2; exit 2 ;;
esac
