#!/usr/bin/env bash
# The dev cluster: a single-node Kubernetes 1.31 from real components, started by the project
# (docs/deploy.md, "The dev cluster"). No Docker engine, no registry: the control plane and
# kubelet are built from the k8s.io/kubernetes module (k8s/tools/apiserver), CoreDNS from its
# own module (k8s/tools/coredns), the Prometheus Operator and Prometheus from theirs
# (k8s/tools/prometheus-operator, k8s/tools/prometheus); etcd, containerd, runc and the CNI
# plugins are Debian's.
#
#   scripts/k8s.sh install   apt packages + Go builds (binaries cached under .cache/k8s/bin)
#   scripts/k8s.sh build     the Go builds only (idempotent; `make test` runs it in the background)
#   scripts/k8s.sh up        install, start what is not running, wait for a Ready node
#   scripts/k8s.sh status    what runs; exits 1 when anything is unhealthy
#   scripts/k8s.sh down      stop what this checkout started (recorded pids), pods included
#   scripts/k8s.sh reset     down, then wipe .stack/k8s (certificates, etcd, containerd state)
#   scripts/k8s.sh env       KUBECONFIG and the addresses the other k8s scripts use
#
# Everything listens on the node address (the bridge's gateway, $NODE_IP, which exists only on
# this machine) or on 127.0.0.1, on ports of its own; containerd has its own socket, root and
# state. Pods live on the bridge $BRIDGE; a FORWARD rule keeps their traffic on this machine.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE_DIR=${FLASHCOUPON_CACHE_DIR:-$ROOT/.cache}
K8S_DIR=${FLASHCOUPON_K8S_DIR:-$ROOT/.stack/k8s}
BIN=$CACHE_DIR/k8s/bin
PKI=$K8S_DIR/pki
LOG_DIR=$K8S_DIR/logs
PID_DIR=$K8S_DIR/pids

K8S_VERSION=v1.31.4
NODE_NAME=${K8S_NODE_NAME:-flashcoupon-dev}
BRIDGE=${K8S_BRIDGE:-fcbr0}
POD_CIDR=${K8S_POD_CIDR:-10.244.0.0/24}
NODE_IP=${K8S_NODE_IP:-10.244.0.1}
SERVICE_CIDR=${K8S_SERVICE_CIDR:-10.96.0.0/16}
KUBERNETES_SVC_IP=${K8S_KUBERNETES_SVC_IP:-10.96.0.1}
CLUSTER_DNS=$NODE_IP
ETCD_PORT=${K8S_ETCD_PORT:-12379}
ETCD_PEER_PORT=${K8S_ETCD_PEER_PORT:-12380}
API_PORT=${K8S_API_PORT:-16443}
KUBELET_PORT=${K8S_KUBELET_PORT:-11250}
KUBELET_HEALTHZ_PORT=${K8S_KUBELET_HEALTHZ_PORT:-11248}
KCM_PORT=${K8S_KCM_PORT:-11257}
SCHED_PORT=${K8S_SCHED_PORT:-11259}
PROXY_HEALTHZ_PORT=${K8S_PROXY_HEALTHZ_PORT:-11256}
PROXY_METRICS_PORT=${K8S_PROXY_METRICS_PORT:-11249}
DNS_HEALTH_PORT=${K8S_DNS_HEALTH_PORT:-11280}
DNS_READY_PORT=${K8S_DNS_READY_PORT:-11281}
CONTAINERD_SOCK=$K8S_DIR/containerd/containerd.sock
PAUSE_IMAGE=localhost/flashcoupon/pause:3.10
PROMETHEUS_OPERATOR_VERSION=v0.85.0 # k8s/tools/prometheus-operator/go.mod
PROMETHEUS_VERSION=v2.42.0          # k8s/tools/prometheus/go.mod: module v0.42.0
# The Prometheus pod's image (scripts/k8s-images.sh): the operator names it
# <base>:<spec.version of the Prometheus object>, k8s/dev/prometheus.yaml asks for v2.42.0.
PROMETHEUS_IMAGE_BASE=localhost/flashcoupon/prometheus
PROM_OPERATOR_PORT=${K8S_PROM_OPERATOR_PORT:-11290}
PROM_OPERATOR_CRDS=$CACHE_DIR/k8s/prometheus-operator-crd
KUBECONFIG_ADMIN=$K8S_DIR/admin.kubeconfig

log() { printf '[k8s %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { printf '[k8s] ERROR: %s\n' "$*" >&2; exit 1; }
alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
kc() { "$BIN/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" "$@"; }

# stdin into FILE only when it differs: a running kube-proxy exits when its config file is
# rewritten, even with the same content.
write_if_changed() {
  local tmp
  tmp=$(mktemp "$1.XXXX")
  cat >"$tmp"
  if cmp -s "$tmp" "$1"; then rm -f "$tmp"; else mv "$tmp" "$1"; fi
}

wait_for() { # seconds description command...
  local deadline=$((SECONDS + $1)) what=$2; shift 2
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.5
  done
  log "$what ready"
}

find_go() {
  command -v go 2>/dev/null || { [ -x /usr/local/go/bin/go ] && echo /usr/local/go/bin/go; } \
    || die "Go is needed to build the Kubernetes components; not found on PATH or /usr/local/go"
}

# ---------------------------------------------------------------- install

install_system() {
  local missing=() pkg
  # kubernetes-client is deliberately absent: Debian's is 1.20; kubectl is built below.
  for pkg in etcd-server containerd runc containernetworking-plugins iptables conntrack jq curl \
    openssl iproute2 podman buildah debootstrap; do
    [[ "$(dpkg-query -W -f '${Status}' "$pkg" 2>/dev/null)" == *"install ok installed"* ]] || missing+=("$pkg")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    log "apt-get install ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
}

# `make test` starts `build` in the background while the other tiers run; the k8s tier's own
# `up` then waits on this lock instead of starting a second build of the same binaries.
build_components() {
  mkdir -p "$CACHE_DIR/k8s"
  exec 9>"$CACHE_DIR/k8s/build.lock"
  flock -n 9 || { log "another process is building the components; waiting for it"; flock 9; }
  build_components_locked
  build_prometheus_locked
  exec 9>&- # released before anything long-lived starts (it would inherit the descriptor)
}

# A digest of a Go build's inputs: each build is skipped while its stamp for that digest exists.
build_key() { cat "$@" | sha256sum | cut -c1-16; }

# One `go build` for every main of the module, so they share one compile of k8s.io/kubernetes.
# The version is stamped the way the release build does, so the API server reports v1.31.x
# (helm's kubeVersion checks and `kubectl version` read it), not v0.0.0-master.
build_components_locked() {
  local src=$ROOT/k8s/tools/apiserver stamp key
  key=$(build_key "$src/go.mod" "$src/go.sum" "$src"/cmd/*/main.go "$src"/pause/main.go \
    "$ROOT/k8s/tools/coredns/go.mod" "$ROOT/k8s/tools/coredns/main.go")
  stamp=$BIN/.built-k8s-$key
  [ -f "$stamp" ] && return
  local t0=$SECONDS go ldflags
  go=$(find_go)
  ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION"
  ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=31"
  ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
  ldflags+=" -X k8s.io/component-base/version.buildDate=2024-12-10T00:00:00Z"
  mkdir -p "$BIN"
  log "building kube-apiserver, kubelet, kube-proxy, kube-scheduler, kube-controller-manager, kubectl $K8S_VERSION (cold: ~10 min on 2 cores)"
  (cd "$src" && GOFLAGS=-buildvcs=false nice -n 10 "$go" build -trimpath -ldflags "$ldflags" -o "$BIN/" ./cmd/...)
  (cd "$src" && CGO_ENABLED=0 GOFLAGS=-buildvcs=false nice -n 10 "$go" build -trimpath -ldflags "-s -w" -o "$BIN/pause" ./pause)
  log "building coredns"
  (cd "$ROOT/k8s/tools/coredns" && GOFLAGS=-buildvcs=false nice -n 10 "$go" build -trimpath -ldflags "-s -w" -o "$BIN/coredns" .)
  rm -f "$BIN"/.built-k8s-*
  touch "$stamp"
  log "components built in $((SECONDS - t0))s"
}

# The dev cluster's Prometheus (docs/deploy.md, "Prometheus in the dev cluster"): the Prometheus
# Operator and its config-reloader from the operator's module, the Prometheus server from its
# own (their dependency graphs differ by years). Static binaries: the reloader and the server
# go into the Prometheus image (scripts/k8s-images.sh), whose base is not what they were built on.
build_prometheus_locked() {
  local op=$ROOT/k8s/tools/prometheus-operator prom=$ROOT/k8s/tools/prometheus key stamp go t0=$SECONDS
  go=$(find_go)
  mkdir -p "$BIN"
  key=$(build_key "$op/go.mod" "$op/go.sum" "$op/tools.go")
  stamp=$BIN/.built-prometheus-operator-$key
  if [ ! -f "$stamp" ]; then
    log "building prometheus-operator, prometheus-config-reloader $PROMETHEUS_OPERATOR_VERSION (cold: ~2 min on 2 cores)"
    local ldflags="-s -w -X github.com/prometheus/common/version.Version=${PROMETHEUS_OPERATOR_VERSION#v}"
    (cd "$op" && CGO_ENABLED=0 GOFLAGS=-buildvcs=false nice -n 10 "$go" build -trimpath -ldflags "$ldflags" \
      -o "$BIN/prometheus-operator" github.com/prometheus-operator/prometheus-operator/cmd/operator)
    (cd "$op" && CGO_ENABLED=0 GOFLAGS=-buildvcs=false nice -n 10 "$go" build -trimpath -ldflags "$ldflags" \
      -o "$BIN/prometheus-config-reloader" github.com/prometheus-operator/prometheus-operator/cmd/prometheus-config-reloader)
    # Its CRDs (monitoring.coreos.com), kept with the binary: `up` applies them without Go.
    local mod
    mod=$(cd "$op" && "$go" list -m -f '{{.Dir}}' github.com/prometheus-operator/prometheus-operator)
    rm -rf "$PROM_OPERATOR_CRDS"
    cp -r "$mod/example/prometheus-operator-crd" "$PROM_OPERATOR_CRDS"
    chmod -R u+w "$PROM_OPERATOR_CRDS"
    rm -f "$BIN"/.built-prometheus-operator-*
    touch "$stamp"
    log "prometheus-operator built in $((SECONDS - t0))s"
  fi
  t0=$SECONDS
  key=$(build_key "$prom/go.mod" "$prom/go.sum" "$prom/tools.go" "$prom/plugins.go")
  stamp=$BIN/.built-prometheus-$key
  if [ ! -f "$stamp" ]; then
    log "building prometheus $PROMETHEUS_VERSION (kubernetes discovery only, no UI assets; cold: ~1 min on 2 cores)"
    # The module's plugins/plugins.go links every service discovery, each with its cloud SDK,
    # and v0.42.0 has no build tags to leave them out (later releases do). The build runs on a
    # copy of the wrapper module whose prometheus is replaced by a copy of the module with our
    # plugins.go (kubernetes only) in place of that file: `go build -overlay` refuses files
    # under GOMODCACHE.
    local work=$CACHE_DIR/k8s/prometheus-build mod
    rm -rf "$work"; mkdir -p "$work"
    cp "$prom/go.mod" "$prom/go.sum" "$prom/tools.go" "$work/"
    # (No jq here: `make test` runs `build` before `install` has put it on a fresh machine.)
    mod=$(cd "$work" && "$go" mod download github.com/prometheus/prometheus \
      && "$go" list -m -f '{{.Dir}}' github.com/prometheus/prometheus)
    cp -r "$mod" "$work/prometheus"
    chmod -R u+w "$work/prometheus"
    cp "$prom/plugins.go" "$work/prometheus/plugins/plugins.go"
    (cd "$work" && "$go" mod edit -replace github.com/prometheus/prometheus=./prometheus)
    local ldflags="-s -w -X github.com/prometheus/common/version.Version=${PROMETHEUS_VERSION#v}"
    ldflags+=" -X github.com/prometheus/common/version.Branch=HEAD"
    (cd "$work" && CGO_ENABLED=0 GOFLAGS=-buildvcs=false nice -n 10 "$go" build -trimpath \
      -ldflags "$ldflags" -o "$BIN/prometheus" github.com/prometheus/prometheus/cmd/prometheus)
    rm -rf "$work"
    rm -f "$BIN"/.built-prometheus-[0-9a-f]*
    touch "$stamp"
    log "prometheus built in $((SECONDS - t0))s"
  fi
}

cmd_install() {
  install_system
  build_components
}

# ---------------------------------------------------------------- host network

# The bridge exists before anything starts: the API server, kubelet and CoreDNS listen on its
# address, which is also what the CNI bridge plugin uses as the pods' gateway.
setup_network() {
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge
  fi
  # (Not `ip | grep -q`: under pipefail, grep's early exit fails the pipeline.)
  [[ "$(ip -4 addr show dev "$BRIDGE")" == *"inet $NODE_IP/"* ]] || ip addr add "$NODE_IP/${POD_CIDR#*/}" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  modprobe br_netfilter 2>/dev/null || true
  modprobe overlay 2>/dev/null || true
  sysctl -qw net.bridge.bridge-nf-call-iptables=1 || die "br_netfilter is needed (Service traffic between pods on one bridge)"
  sysctl -qw net.ipv4.ip_forward=1
  # Pods talk to each other and to this machine, nothing else: nothing they send is forwarded
  # out of the bridge (they have no masquerade either).
  iptables -C FORWARD -i "$BRIDGE" ! -o "$BRIDGE" -j DROP 2>/dev/null \
    || iptables -I FORWARD 1 -i "$BRIDGE" ! -o "$BRIDGE" -j DROP
}

# ---------------------------------------------------------------- certificates

cert() { # name subject [sans] — a key and a certificate signed by the cluster CA
  local name=$1 subj=$2 sans=${3:-}
  [ -f "$PKI/$name.crt" ] && return
  openssl genrsa -out "$PKI/$name.key" 2048 2>/dev/null
  openssl req -new -key "$PKI/$name.key" -subj "$subj" -out "$PKI/$name.csr" 2>/dev/null
  local ext=$PKI/$name.ext
  printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n' >"$ext"
  [ -z "$sans" ] || echo "subjectAltName=$sans" >>"$ext"
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
    -days 3650 -sha256 -extfile "$ext" -out "$PKI/$name.crt" 2>/dev/null
  rm -f "$PKI/$name.csr" "$ext"
}

kubeconfig() { # file user-cert-name
  local file=$1 name=$2
  [ -f "$file" ] && return
  cat >"$file" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: flashcoupon-dev
  cluster: {server: "https://$NODE_IP:$API_PORT", certificate-authority: "$PKI/ca.crt"}
users:
- name: $name
  user: {client-certificate: "$PKI/$name.crt", client-key: "$PKI/$name.key"}
contexts:
- name: flashcoupon-dev
  context: {cluster: flashcoupon-dev, user: $name}
current-context: flashcoupon-dev
EOF
}

make_pki() {
  mkdir -p "$PKI"
  if [ ! -f "$PKI/ca.crt" ]; then
    openssl genrsa -out "$PKI/ca.key" 2048 2>/dev/null
    openssl req -x509 -new -key "$PKI/ca.key" -subj "/CN=flashcoupon-dev-ca" -days 3650 -sha256 \
      -out "$PKI/ca.crt" 2>/dev/null
  fi
  if [ ! -f "$PKI/sa.key" ]; then
    openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
    openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
  fi
  cert apiserver "/CN=kube-apiserver" \
    "IP:$NODE_IP,IP:$KUBERNETES_SVC_IP,IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
  cert admin "/O=system:masters/CN=flashcoupon-admin"
  cert controller-manager "/CN=system:kube-controller-manager"
  cert scheduler "/CN=system:kube-scheduler"
  cert kubelet "/O=system:nodes/CN=system:node:$NODE_NAME" "IP:$NODE_IP,DNS:$NODE_NAME"
  cert kube-proxy "/CN=system:kube-proxy"
  cert coredns "/CN=flashcoupon:coredns"
  kubeconfig "$KUBECONFIG_ADMIN" admin
  kubeconfig "$K8S_DIR/controller-manager.kubeconfig" controller-manager
  kubeconfig "$K8S_DIR/scheduler.kubeconfig" scheduler
  kubeconfig "$K8S_DIR/kubelet.kubeconfig" kubelet
  kubeconfig "$K8S_DIR/kube-proxy.kubeconfig" kube-proxy
  kubeconfig "$K8S_DIR/coredns.kubeconfig" coredns
}

# ---------------------------------------------------------------- processes

start() { # name command... — nohup'd, pid recorded, log under .stack/k8s/logs
  local name=$1; shift
  alive "$PID_DIR/$name.pid" && return
  nohup "$@" >"$LOG_DIR/$name.log" 2>&1 &
  echo $! >"$PID_DIR/$name.pid"
}

healthz() { # url: an HTTPS health endpoint answering "ok"
  [[ "$(curl -sf --max-time 2 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" "$1")" == ok* ]]
}

start_etcd() {
  start etcd etcd --name flashcoupon-dev --data-dir "$K8S_DIR/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "flashcoupon-dev=http://127.0.0.1:$ETCD_PEER_PORT" \
    --listen-metrics-urls "" --quota-backend-bytes 2147483648
  wait_for 30 "etcd :$ETCD_PORT" curl -sf "http://127.0.0.1:$ETCD_PORT/health" || die "etcd did not start; see $LOG_DIR/etcd.log"
}

start_apiserver() {
  # NodeRestriction on top of the default admission plugins; Node + RBAC authorization, so the
  # chart's ServiceAccounts, Roles and the kubelet's own credentials are really checked.
  start kube-apiserver "$BIN/kube-apiserver" \
    --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address "$NODE_IP" --advertise-address "$NODE_IP" --secure-port "$API_PORT" \
    --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
    --client-ca-file "$PKI/ca.crt" \
    --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" \
    --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types InternalIP \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
    --allow-privileged=true --profiling=false --endpoint-reconciler-type lease
  wait_for 90 "kube-apiserver :$API_PORT" healthz "https://$NODE_IP:$API_PORT/readyz" \
    || die "kube-apiserver is not ready; see $LOG_DIR/kube-apiserver.log"
}

start_controllers() {
  start kube-controller-manager "$BIN/kube-controller-manager" \
    --kubeconfig "$K8S_DIR/controller-manager.kubeconfig" \
    --authentication-kubeconfig "$K8S_DIR/controller-manager.kubeconfig" \
    --authorization-kubeconfig "$K8S_DIR/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$KCM_PORT" --leader-elect=false \
    --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
    --root-ca-file "$PKI/ca.crt" --service-account-private-key-file "$PKI/sa.key" \
    --use-service-account-credentials=true --service-cluster-ip-range "$SERVICE_CIDR" \
    --cluster-cidr "$POD_CIDR" --allocate-node-cidrs=false --profiling=false
  start kube-scheduler "$BIN/kube-scheduler" \
    --kubeconfig "$K8S_DIR/scheduler.kubeconfig" \
    --authentication-kubeconfig "$K8S_DIR/scheduler.kubeconfig" \
    --authorization-kubeconfig "$K8S_DIR/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$SCHED_PORT" --leader-elect=false --profiling=false
  wait_for 60 "kube-controller-manager" curl -sfk "https://127.0.0.1:$KCM_PORT/healthz" \
    || die "kube-controller-manager is not healthy; see $LOG_DIR/kube-controller-manager.log"
  wait_for 60 "kube-scheduler" curl -sfk "https://127.0.0.1:$SCHED_PORT/healthz" \
    || die "kube-scheduler is not healthy; see $LOG_DIR/kube-scheduler.log"
}

write_containerd_config() {
  local dir=$K8S_DIR/containerd
  mkdir -p "$dir" "$K8S_DIR/cni/net.d" "$K8S_DIR/cni/ipam"
  write_if_changed "$K8S_DIR/cni/net.d/10-flashcoupon.conflist" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "flashcoupon-dev",
  "plugins": [
    {
      "type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
      "ipam": {
        "type": "host-local", "dataDir": "$K8S_DIR/cni/ipam",
        "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$NODE_IP"}]],
        "routes": [{"dst": "0.0.0.0/0"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
  write_if_changed "$dir/config.toml" <<EOF
version = 2
root = "$dir/root"
state = "$dir/state"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper"]

[grpc]
  address = "$CONTAINERD_SOCK"
[ttrpc]
  address = "$CONTAINERD_SOCK.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = "$dir/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        # runc, not crun (crun refuses hybrid cgroups), through the dev-only oom_score_adj
        # wrapper: scripts/k8s-runc-wrapper.sh says why.
        BinaryName = "$ROOT/scripts/k8s-runc-wrapper.sh"
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$K8S_DIR/cni/net.d"
EOF
}

ctr_k8s() { ctr --address "$CONTAINERD_SOCK" -n k8s.io "$@"; }

# The pod sandbox image, made here: a static pause binary (k8s/tools/apiserver/pause) in an
# otherwise empty image, imported into containerd's k8s.io namespace (no registry to pull from).
ensure_pause_image() {
  local refs
  refs=$(ctr_k8s images ls -q)
  grep -qx "$PAUSE_IMAGE" <<<"$refs" && return
  local tmp
  tmp=$(mktemp -d "$K8S_DIR/pause.XXXX")
  mkdir -p "$tmp/layer" "$tmp/oci/blobs/sha256"
  cp "$BIN/pause" "$tmp/layer/pause"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$tmp/layer" -cf "$tmp/layer.tar" pause
  python3 - "$tmp" "$PAUSE_IMAGE" <<'PY'
import hashlib, json, os, shutil, sys
tmp, ref = sys.argv[1], sys.argv[2]
blobs = os.path.join(tmp, "oci/blobs/sha256")
def blob(data: bytes) -> tuple[str, int]:
    digest = hashlib.sha256(data).hexdigest()
    with open(os.path.join(blobs, digest), "wb") as f:
        f.write(data)
    return "sha256:" + digest, len(data)
layer = open(os.path.join(tmp, "layer.tar"), "rb").read()
ldigest, lsize = blob(layer)
config = {"architecture": "amd64", "os": "linux",
          "config": {"Entrypoint": ["/pause"], "User": "65535:65535"},
          "rootfs": {"type": "layers", "diff_ids": [ldigest]}}
cdigest, csize = blob(json.dumps(config).encode())
manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cdigest, "size": csize},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": ldigest, "size": lsize}]}
mdigest, msize = blob(json.dumps(manifest).encode())
index = {"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
         "digest": mdigest, "size": msize,
         "annotations": {"io.containerd.image.name": ref, "org.opencontainers.image.ref.name": ref}}]}
json.dump(index, open(os.path.join(tmp, "oci/index.json"), "w"))
json.dump({"imageLayoutVersion": "1.0.0"}, open(os.path.join(tmp, "oci/oci-layout"), "w"))
PY
  tar -C "$tmp/oci" -cf "$tmp/pause.tar" .
  ctr_k8s images import --no-unpack=false "$tmp/pause.tar" >/dev/null
  rm -rf "$tmp"
  log "pause image $PAUSE_IMAGE imported"
}

start_containerd() {
  write_containerd_config
  start containerd containerd --config "$K8S_DIR/containerd/config.toml"
  wait_for 30 "containerd" ctr --address "$CONTAINERD_SOCK" version \
    || die "containerd did not start; see $LOG_DIR/containerd.log"
  ensure_pause_image
}

start_kubelet() {
  mkdir -p "$K8S_DIR/kubelet"
  echo "nameserver $CLUSTER_DNS" | write_if_changed "$K8S_DIR/resolv.conf"
  write_if_changed "$K8S_DIR/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$PKI/ca.crt"}
authorization: {mode: Webhook}
tlsCertFile: "$PKI/kubelet.crt"
tlsPrivateKeyFile: "$PKI/kubelet.key"
containerRuntimeEndpoint: "unix://$CONTAINERD_SOCK"
cgroupDriver: cgroupfs
clusterDNS: ["$CLUSTER_DNS"]
clusterDomain: cluster.local
resolvConf: "$K8S_DIR/resolv.conf"
failSwapOn: false
# The kubelet's own oom_score_adj: lowering it needs CAP_SYS_RESOURCE, which this sandbox lacks.
oomScoreAdj: 0
protectKernelDefaults: false
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "200Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
maxPods: 60
EOF
  start kubelet "$BIN/kubelet" --config "$K8S_DIR/kubelet.yaml" \
    --kubeconfig "$K8S_DIR/kubelet.kubeconfig" --hostname-override "$NODE_NAME" \
    --node-ip "$NODE_IP" --root-dir "$K8S_DIR/kubelet" --cert-dir "$K8S_DIR/kubelet/pki"
  wait_for 90 "kubelet" curl -sf "http://127.0.0.1:$KUBELET_HEALTHZ_PORT/healthz" \
    || die "kubelet is not healthy; see $LOG_DIR/kubelet.log"
}

start_proxy() {
  write_if_changed "$K8S_DIR/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {kubeconfig: "$K8S_DIR/kube-proxy.kubeconfig"}
hostnameOverride: $NODE_NAME
bindAddress: $NODE_IP
clusterCIDR: $POD_CIDR
healthzBindAddress: 127.0.0.1:$PROXY_HEALTHZ_PORT
metricsBindAddress: 127.0.0.1:$PROXY_METRICS_PORT
# NodePorts answer on loopback (load tests target 127.0.0.1) and on the node address only.
nodePortAddresses: ["127.0.0.0/8", "$NODE_IP/32"]
# Leave the host's conntrack sysctls alone (0 = as they are).
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
EOF
  start kube-proxy "$BIN/kube-proxy" --config "$K8S_DIR/kube-proxy.yaml"
  wait_for 60 "kube-proxy" curl -sf "http://127.0.0.1:$PROXY_HEALTHZ_PORT/healthz" \
    || die "kube-proxy is not healthy; see $LOG_DIR/kube-proxy.log"
}

start_coredns() {
  write_if_changed "$K8S_DIR/Corefile" <<EOF
.:53 {
    bind $CLUSTER_DNS
    errors
    health 127.0.0.1:$DNS_HEALTH_PORT
    ready 127.0.0.1:$DNS_READY_PORT
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $K8S_DIR/coredns.kubeconfig
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 30
    loadbalance
}
EOF
  start coredns "$BIN/coredns" -conf "$K8S_DIR/Corefile"
  wait_for 60 "coredns $CLUSTER_DNS:53" curl -sf "http://127.0.0.1:$DNS_READY_PORT/ready" \
    || die "coredns is not ready; see $LOG_DIR/coredns.log"
}

# The Prometheus Operator on the node, like the control plane (docs/deploy.md, "Prometheus in
# the dev cluster"), with the admin credentials: it turns Prometheus, ServiceMonitor and
# PrometheusRule objects into a Prometheus StatefulSet and its configuration. Its CRDs are
# applied server-side: the Prometheus one exceeds the 256 KiB last-applied annotation that a
# client-side apply writes.
start_prometheus_operator() {
  kc apply --server-side --force-conflicts -f "$PROM_OPERATOR_CRDS" >/dev/null
  wait_for 60 "monitoring.coreos.com CRDs" kc wait --for condition=Established --timeout 5s \
    crd/prometheuses.monitoring.coreos.com crd/servicemonitors.monitoring.coreos.com \
    crd/prometheusrules.monitoring.coreos.com || die "the monitoring.coreos.com CRDs are not established"
  start prometheus-operator "$BIN/prometheus-operator" \
    --apiserver "https://$NODE_IP:$API_PORT" --ca-file "$PKI/ca.crt" \
    --cert-file "$PKI/admin.crt" --key-file "$PKI/admin.key" \
    --web.listen-address "127.0.0.1:$PROM_OPERATOR_PORT" \
    --prometheus-default-base-image "$PROMETHEUS_IMAGE_BASE" \
    --prometheus-config-reloader "$PROMETHEUS_IMAGE_BASE:$PROMETHEUS_VERSION" \
    --cluster-domain cluster.local
  wait_for 60 "prometheus-operator 127.0.0.1:$PROM_OPERATOR_PORT" \
    curl -sf "http://127.0.0.1:$PROM_OPERATOR_PORT/healthz" \
    || die "prometheus-operator is not healthy; see $LOG_DIR/prometheus-operator.log"
}

apply_bootstrap_rbac() {
  kc apply -f - >/dev/null <<'EOF'
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: "flashcoupon:coredns"}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "flashcoupon:coredns"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "flashcoupon:coredns"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: "flashcoupon:coredns"}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: "flashcoupon:kube-proxy"}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: "system:node-proxier"}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: "system:kube-proxy"}]
EOF
}

node_ready() {
  [ "$(kc get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}

cmd_up() {
  local t0=$SECONDS
  cmd_install
  mkdir -p "$LOG_DIR" "$PID_DIR"
  setup_network
  make_pki
  start_etcd
  start_apiserver
  apply_bootstrap_rbac
  start_controllers
  start_containerd
  start_kubelet
  start_proxy
  start_coredns
  start_prometheus_operator
  wait_for 120 "node $NODE_NAME" node_ready || die "node $NODE_NAME is not Ready; see $LOG_DIR/kubelet.log"
  log "cluster up in $((SECONDS - t0))s — export KUBECONFIG=$KUBECONFIG_ADMIN"
}

# ---------------------------------------------------------------- status / down

COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet kube-proxy coredns
  prometheus-operator)

cmd_status() {
  local bad=0 name
  for name in "${COMPONENTS[@]}"; do
    if alive "$PID_DIR/$name.pid"; then
      printf '  %-24s up (pid %s)\n' "$name" "$(cat "$PID_DIR/$name.pid")"
    else
      printf '  %-24s DOWN\n' "$name"; bad=1
    fi
  done
  if [ $bad = 0 ]; then
    printf '  %-24s %s\n' "server version" "$(kc version -o json 2>/dev/null | jq -r .serverVersion.gitVersion)"
    kc get nodes -o wide 2>/dev/null | sed 's/^/  /' || bad=1
    node_ready || { echo "  node $NODE_NAME is not Ready"; bad=1; }
    kc get pods -A -o wide 2>/dev/null | sed 's/^/  /'
  fi
  echo "  KUBECONFIG=$KUBECONFIG_ADMIN"
  return $bad
}

stop_pid() { # pidfile name
  local pidfile=$1 pid i
  [ -f "$pidfile" ] || return 0
  pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for i in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -9 "$pid" 2>/dev/null || true
    log "stopped $2 (pid $pid)"
  fi
  rm -f "$pidfile"
}

unmount_under() { # prefix: every mount below it, deepest first
  local mounts m
  mounts=$(findmnt -rn -o TARGET | grep -F "$1" | sort -r || true)
  for m in $mounts; do umount -l "$m" 2>/dev/null || true; done
}

# The shims of this containerd (found by its socket in their command line) and the processes
# they run: pods do not stop with containerd, so `down` stops them explicitly.
stop_pods() {
  local pid
  for pid in $(pgrep -f "containerd-shim-runc-v2 .*-address $CONTAINERD_SOCK" || true); do
    pkill -KILL -P "$pid" 2>/dev/null || true
    kill -KILL "$pid" 2>/dev/null || true
  done
  # Their mounts (overlay rootfs, shm, projected volumes) and network namespaces.
  unmount_under "$K8S_DIR/"
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
    ip -n "$ns" -4 addr 2>/dev/null | grep -q "inet ${POD_CIDR%.*}\." && ip netns delete "$ns" 2>/dev/null || true
  done
  rm -rf "$K8S_DIR/cni/ipam"
}

cmd_down() {
  local name
  # First: left running, it would recreate the Prometheus StatefulSet's pods as they stop.
  stop_pid "$PID_DIR/prometheus-operator.pid" prometheus-operator
  stop_pid "$PID_DIR/kubelet.pid" kubelet
  stop_pods
  for name in coredns kube-proxy containerd kube-scheduler kube-controller-manager kube-apiserver etcd; do
    stop_pid "$PID_DIR/$name.pid" "$name"
  done
  [ -x "$BIN/kube-proxy" ] && "$BIN/kube-proxy" --cleanup >/dev/null 2>&1 || true
}

cmd_reset() {
  cmd_down
  unmount_under "$K8S_DIR/"
  rm -rf "$K8S_DIR"
  iptables -D FORWARD -i "$BRIDGE" ! -o "$BRIDGE" -j DROP 2>/dev/null || true
  ip link delete "$BRIDGE" 2>/dev/null || true
  log "state wiped under $K8S_DIR"
}

case "${1:-}" in
  install) cmd_install ;;
  build) build_components ;;
  up) cmd_up ;;
  status) cmd_status ;;
  down) cmd_down ;;
  reset) cmd_reset ;;
  env)
    echo "KUBECONFIG=$KUBECONFIG_ADMIN"
    echo "K8S_BIN=$BIN"
    echo "K8S_NODE_IP=$NODE_IP"
    echo "K8S_CONTAINERD_SOCK=$CONTAINERD_SOCK"
    echo "K8S_PROMETHEUS_IMAGE=$PROMETHEUS_IMAGE_BASE:$PROMETHEUS_VERSION"
    ;;
  *) echo "usage: $0 install|build|up|status|down|reset|env" >&2; exit 2 ;;
esac
