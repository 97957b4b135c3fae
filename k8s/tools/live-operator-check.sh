#!/usr/bin/env bash
# The CouponEvent CRD and operator against a real Kubernetes API server (kube-apiserver 1.31
# built from source + Debian etcd, private ports, no cluster), using the local stack for Redis
# and MySQL (`make stack-up` first). Checks: the CRD registers; the API server refuses every
# k8s/tools/crdcheck/testdata/bad-*.yaml and accepts the examples; the operator preloads an event
# (phase Active, printer columns), refreshes issued, refuses lowering below issued (condition +
# event), accepts a raise, and on delete waits for MySQL until forced, then cleans Redis.
# Needs Go and kubectl; the first run builds kube-apiserver (~10 min on 2 cores).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
cache="$root/.cache"
apiserver="$cache/kube-apiserver"
py="$root/.venv/bin/python"
mkdir -p "$cache"
if [[ ! -x "$apiserver" || "$root/k8s/tools/apiserver/go.mod" -nt "$apiserver" ]]; then
  echo "[live] building kube-apiserver (once)"
  (cd "$root/k8s/tools/apiserver" && nice -n 10 go build -o "$apiserver" ./cmd/kube-apiserver)
fi
command -v etcd >/dev/null || { apt-get update -q && apt-get install -y -q etcd-server; }

free_port() { "$py" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
state="$(mktemp -d "$cache/live-operator.XXXX")"
etcd_port=$(free_port); peer_port=$(free_port); api_port=$(free_port); live_port=$(free_port)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; sleep 1; rm -rf "$state"; }
trap cleanup EXIT

openssl genrsa -out "$state/sa.key" 2048 2>/dev/null
openssl rsa -in "$state/sa.key" -pubout -out "$state/sa.pub" 2>/dev/null
echo "livetoken,admin,admin,system:masters" > "$state/tokens.csv"
etcd --data-dir "$state/etcd" --listen-client-urls "http://127.0.0.1:$etcd_port" \
  --advertise-client-urls "http://127.0.0.1:$etcd_port" --listen-peer-urls "http://127.0.0.1:$peer_port" \
  > "$state/etcd.log" 2>&1 &
pids+=($!)
"$apiserver" --etcd-servers="http://127.0.0.1:$etcd_port" --secure-port="$api_port" \
  --bind-address=127.0.0.1 --cert-dir="$state/certs" --service-account-issuer=https://kubernetes.default.svc \
  --service-account-key-file="$state/sa.pub" --service-account-signing-key-file="$state/sa.key" \
  --token-auth-file="$state/tokens.csv" --authorization-mode=AlwaysAllow \
  --service-cluster-ip-range=10.0.0.0/24 --disable-admission-plugins=ServiceAccount \
  > "$state/apiserver.log" 2>&1 &
pids+=($!)
export KUBECONFIG="$state/kubeconfig"
cat > "$KUBECONFIG" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: live, cluster: {server: "https://127.0.0.1:$api_port", insecure-skip-tls-verify: true}}]
users: [{name: admin, user: {token: livetoken}}]
contexts: [{name: live, context: {cluster: live, user: admin, namespace: default}}]
current-context: live
EOF
for _ in $(seq 90); do kubectl get --raw /readyz >/dev/null 2>&1 && break; sleep 2; done
kubectl get --raw /readyz >/dev/null || { tail -20 "$state/apiserver.log"; exit 1; }
echo "[live] API server ready on :$api_port"

fail() { echo "[live] FAIL: $*"; exit 1; }
kubectl apply -f "$root/k8s/crd/couponevents.flashcoupon.io.yaml" >/dev/null
kubectl wait --for=condition=Established crd/couponevents.flashcoupon.io --timeout=60s >/dev/null
echo "[live] PASS CRD established"
for f in "$root"/k8s/examples/*.yaml; do
  kubectl apply --dry-run=server -f "$f" >/dev/null || fail "example $f refused"
done
for f in "$root"/k8s/tools/crdcheck/testdata/bad-*.yaml; do
  if kubectl apply --dry-run=server -f "$f" >/dev/null 2>&1; then fail "$f accepted"; fi
done
echo "[live] PASS examples accepted, every bad-*.yaml refused"

FLASHCOUPON_OPERATOR_NAMESPACE=default FLASHCOUPON_OPERATOR_REFRESH_SECONDS=2 \
  FLASHCOUPON_OPERATOR_LIVENESS="http://127.0.0.1:$live_port/healthz" \
  "$py" -m flashcoupon_operator > "$state/operator.log" 2>&1 &
pids+=($!)
name="live-$(date +%s)-$RANDOM"
"$py" - "$name" "$root/k8s/examples/demo-drop.yaml" <<'EOF' | kubectl apply -f - >/dev/null
import sys, yaml
doc = yaml.safe_load(open(sys.argv[2]))
doc["metadata"]["name"] = sys.argv[1]
print(yaml.safe_dump(doc))
EOF
ce="couponevent/$name"
kubectl wait "$ce" --for=jsonpath='{.status.phase}'=Active --timeout=60s >/dev/null \
  || { tail -20 "$state/operator.log"; fail "not Active"; }
kubectl get couponevents "$name"
echo "[live] PASS preloaded and Active"

"$py" - "$name" <<'EOF'
import asyncio, sys
from flashcoupon_common import keys
from flashcoupon_common.lua import ISSUE
from flashcoupon_common.redis_cluster import create_redis_cluster
from flashcoupon_common.settings import RedisSettings
async def main() -> None:
    r = create_redis_cluster(RedisSettings.from_env())
    for i in range(3):
        reply = await r.eval(ISSUE.source, 4, *keys.issue_keys(sys.argv[1]), f"u{i}", f"r{i}", "")
        assert reply[0] == b"ISSUED", reply
    await r.aclose()
asyncio.run(main())
EOF
kubectl wait "$ce" --for=jsonpath='{.status.issued}'=3 --timeout=30s >/dev/null || fail "issued not refreshed"
echo "[live] PASS status.issued refreshed by the timer"

kubectl patch "$ce" --type merge -p '{"spec":{"quantity":1}}' >/dev/null
kubectl wait "$ce" --for=jsonpath='{.status.conditions[?(@.type=="SpecAccepted")].reason}'=Rejected \
  --timeout=30s >/dev/null || fail "lowering below issued not refused"
kubectl get events --field-selector "involvedObject.name=$name" -o jsonpath='{.items[*].message}' \
  | grep -q "cannot lower to 1" || fail "no warning event"
echo "[live] PASS lowering below issued refused (condition + event)"

kubectl patch "$ce" --type merge -p '{"spec":{"quantity":150}}' >/dev/null
kubectl wait "$ce" --for=jsonpath='{.status.quantity}'=150 --timeout=30s >/dev/null || fail "raise not applied"
echo "[live] PASS quantity raised to 150"

kubectl delete "$ce" --wait=false >/dev/null
sleep 5
kubectl get "$ce" >/dev/null 2>&1 || fail "deleted although 3 coupons are not in MySQL"
kubectl annotate "$ce" flashcoupon.io/force-delete=true >/dev/null
kubectl wait "$ce" --for=delete --timeout=60s >/dev/null || fail "not deleted after force"
"$root/.venv/bin/couponctl" status "$name" --json | grep -q '"phase": "Deleted"' || fail "catalog not marked"
echo "[live] PASS delete waited for MySQL, then force-deleted; Redis cleaned, catalog row kept"
echo "[live] all checks passed"
