#!/usr/bin/env bash
# The four images for the dev cluster, built from the project's own Dockerfiles without a Docker
# engine or a registry (docs/deploy.md, "Images without a registry"):
#
#   1. a base image made here: Debian bookworm (debootstrap, minbase) + python3.11 + pip, passed
#      as the Dockerfiles' PYTHON_IMAGE build argument (what differs from python:3.12-slim:
#      Python 3.11 from Debian at /usr/bin, symlinked into /usr/local/bin where the Dockerfiles
#      expect it; Debian's pip with its "externally managed" marker removed, as in the official
#      image);
#   2. `podman build` of each Dockerfile, RUN steps on the host network, the host's CA bundle
#      mounted read-only for the build only (the registries are reached through a
#      TLS-intercepting proxy) — it is never part of a layer;
#   3. `podman save --format oci-archive` → `ctr -n k8s.io images import` into the dev cluster's
#      containerd, tagged from the git commit (the chart pulls IfNotPresent).
#
#   scripts/k8s-images.sh build [SERVICE...]   base (once), then the images; prints the tag
#   scripts/k8s-images.sh tag                  the tag the current tree builds
#
# `prometheus` (in the default list) is the dev cluster's Prometheus pod: the Go-built binaries
# of .cache/k8s/bin (scripts/k8s.sh build) on the same base, tagged with the Prometheus version
# the Prometheus Operator asks for (docs/deploy.md, "Prometheus in the dev cluster").
#
# Podman keeps its own configuration and storage under .cache/k8s/podman (layers are reused
# between runs), never the system's.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE_DIR=${FLASHCOUPON_CACHE_DIR:-$ROOT/.cache}
K8S_DIR=${FLASHCOUPON_K8S_DIR:-$ROOT/.stack/k8s}
PODMAN_DIR=$CACHE_DIR/k8s/podman
BASE_DIR=$CACHE_DIR/k8s/base
BASE_IMAGE=localhost/flashcoupon/python:3.11-bookworm
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
CA_BUNDLE=${FLASHCOUPON_BUILD_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}
CONTAINERD_SOCK=$K8S_DIR/containerd/containerd.sock
SERVICES=(gateway issuer persister operator prometheus)

log() { printf '[k8s-images %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { printf '[k8s-images] ERROR: %s\n' "$*" >&2; exit 1; }

dockerfile() {
  case "$1" in
    operator) echo operator/Dockerfile ;;
    gateway | issuer | persister) echo "services/$1/Dockerfile" ;;
    prometheus) echo k8s/tools/prometheus/Containerfile ;;
    *) die "unknown image $1 (one of ${SERVICES[*]})" ;;
  esac
}

# What the images contain (the build context .dockerignore lets through, and the Dockerfiles).
IMAGE_INPUTS=(libs/common services operator pyproject.toml uv.lock .dockerignore)

# The last commit that changed what the images contain (so a commit elsewhere rebuilds nothing),
# plus a digest of uncommitted changes to it, so an image from a dirty tree never reuses the
# clean commit's tag.
image_tag() {
  local tag dirty
  tag=git-$(git -C "$ROOT" log -1 --format=%h --abbrev=12 -- "${IMAGE_INPUTS[@]}")
  dirty=$(git -C "$ROOT" status --porcelain -- "${IMAGE_INPUTS[@]}")
  if [ -n "$dirty" ]; then
    tag+=-dirty-$( (git -C "$ROOT" diff HEAD -- "${IMAGE_INPUTS[@]}"; git -C "$ROOT" ls-files -o --exclude-standard -- "${IMAGE_INPUTS[@]}" | xargs -r sha256sum) | sha256sum | cut -c1-8)
  fi
  echo "$tag"
}

podman_env() {
  mkdir -p "$PODMAN_DIR/storage" "$PODMAN_DIR/run" "$PODMAN_DIR/tmp"
  cat >"$PODMAN_DIR/containers.conf" <<EOF
[containers]
# The default ulimits exceed this sandbox's hard limit.
default_ulimits = ["nofile=20000:20000"]
[engine]
# crun refuses hybrid cgroups; runc works.
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
tmp_dir = "$PODMAN_DIR/tmp"
EOF
  cat >"$PODMAN_DIR/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$PODMAN_DIR/storage"
runroot = "$PODMAN_DIR/run"
EOF
  export CONTAINERS_CONF=$PODMAN_DIR/containers.conf CONTAINERS_STORAGE_CONF=$PODMAN_DIR/storage.conf
  export TMPDIR=$PODMAN_DIR/tmp
}

build_base() {
  podman image exists "$BASE_IMAGE" && return
  local t0=$SECONDS rootfs=$BASE_DIR/rootfs
  log "debootstrap bookworm (minbase) + python3.11 into $rootfs"
  rm -rf "$rootfs"; mkdir -p "$rootfs"
  debootstrap --variant=minbase --include=python3.11,python3-pip,ca-certificates \
    bookworm "$rootfs" "$DEBIAN_MIRROR" >"$BASE_DIR/debootstrap.log" 2>&1 \
    || { tail -20 "$BASE_DIR/debootstrap.log"; die "debootstrap failed"; }
  # Where python:3.12-slim has them, so the Dockerfiles' UV_PYTHON=/usr/local/bin/python3 holds.
  ln -sf /usr/bin/python3.11 "$rootfs/usr/local/bin/python3"
  ln -sf /usr/bin/python3.11 "$rootfs/usr/local/bin/python"
  ln -sf /usr/bin/pip3 "$rootfs/usr/local/bin/pip"
  rm -f "$rootfs"/usr/lib/python3.*/EXTERNALLY-MANAGED
  rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
  tar --numeric-owner -C "$rootfs" -c . | podman import \
    --change 'ENV LANG=C.UTF-8' --change 'ENV UV_NATIVE_TLS=1' --change 'CMD ["python3"]' \
    - "$BASE_IMAGE" >/dev/null
  rm -rf "$rootfs"
  log "base image $BASE_IMAGE in $((SECONDS - t0))s"
}

ctr_k8s() { ctr --address "$CONTAINERD_SOCK" -n k8s.io "$@"; }
# The listing first, then grep: `ctr | grep -q` fails under pipefail when grep exits early.
in_containerd() { local refs; refs=$(ctr_k8s images ls -q); grep -qx "$1" <<<"$refs"; }

import_into_containerd() { # ref base-name
  local ref=$1 archive=$PODMAN_DIR/tmp/import.tar
  rm -f "$archive"
  podman save -q --format oci-archive -o "$archive" "$ref"
  ctr_k8s images import --base-name "$2" "$archive" >/dev/null
  rm -f "$archive"
  in_containerd "$ref" || die "$ref is not in containerd after the import"
  log "$ref imported into containerd (k8s.io)"
}

# The version tag stays while the binaries may be rebuilt (new go.sum), so the image carries
# their digest as a label and is rebuilt, and imported again, when it differs.
build_prometheus() {
  local bin=$CACHE_DIR/k8s/bin ref t0=$SECONDS digest context
  ref=$(sed -n 's/^K8S_PROMETHEUS_IMAGE=//p' <<<"$("$ROOT/scripts/k8s.sh" env)")
  [ -x "$bin/prometheus" ] && [ -x "$bin/prometheus-config-reloader" ] \
    || die "no prometheus binaries in $bin: run scripts/k8s.sh build"
  digest=$(cat "$bin/prometheus" "$bin/prometheus-config-reloader" | sha256sum | cut -c1-16)
  local built=""
  if [ "$(podman image inspect --format '{{index .Labels "io.flashcoupon.binaries"}}' "$ref" 2>/dev/null)" != "$digest" ]; then
    log "podman build $(dockerfile prometheus) → $ref"
    context=$PODMAN_DIR/tmp/prometheus-context
    rm -rf "$context"; mkdir -p "$context"
    cp "$bin/prometheus" "$bin/prometheus-config-reloader" "$context/"
    podman build --network none --pull=never --build-arg "BASE_IMAGE=$BASE_IMAGE" \
      --label "io.flashcoupon.binaries=$digest" -f "$ROOT/$(dockerfile prometheus)" -t "$ref" \
      "$context" >"$PODMAN_DIR/build-prometheus.log" 2>&1 \
      || { tail -30 "$PODMAN_DIR/build-prometheus.log"; die "building prometheus failed"; }
    rm -rf "$context"
    built=1
    log "prometheus built in $((SECONDS - t0))s"
  fi
  if [ -S "$CONTAINERD_SOCK" ]; then
    if [ -n "$built" ] || ! in_containerd "$ref"; then import_into_containerd "$ref" "${ref%:*}"; fi
  else
    log "no dev cluster running ($CONTAINERD_SOCK): $ref stays in podman's storage"
  fi
}

build_one() { # service tag
  local svc=$1 tag=$2 ref t0=$SECONDS
  [ "$svc" = prometheus ] && { build_prometheus; return; }
  ref=localhost/flashcoupon-$svc:$tag
  if ! podman image exists "$ref"; then
    log "podman build $(dockerfile "$svc") → $ref"
    (cd "$ROOT" && podman build --network host --pull=never \
      --volume "$CA_BUNDLE:/etc/ssl/certs/ca-certificates.crt:ro" \
      --build-arg "PYTHON_IMAGE=$BASE_IMAGE" \
      -f "$(dockerfile "$svc")" -t "$ref" .) >"$PODMAN_DIR/build-$svc.log" 2>&1 \
      || { tail -30 "$PODMAN_DIR/build-$svc.log"; die "building $svc failed ($PODMAN_DIR/build-$svc.log)"; }
    log "$svc built in $((SECONDS - t0))s"
  fi
  if [ -S "$CONTAINERD_SOCK" ]; then
    in_containerd "$ref" || import_into_containerd "$ref" "localhost/flashcoupon-$svc"
  else
    log "no dev cluster running ($CONTAINERD_SOCK): $ref stays in podman's storage"
  fi
}

cmd_build() {
  local t0=$SECONDS tag svc
  [ -f "$CA_BUNDLE" ] || die "no CA bundle at $CA_BUNDLE (FLASHCOUPON_BUILD_CA_BUNDLE)"
  podman_env
  build_base
  tag=$(image_tag)
  [ $# -gt 0 ] || set -- "${SERVICES[@]}"
  for svc in "$@"; do build_one "$svc" "$tag"; done
  log "images $tag ready in $((SECONDS - t0))s"
}

case "${1:-}" in
  build) shift; cmd_build "$@" ;;
  tag) image_tag ;;
  *) echo "usage: $0 build [SERVICE...] | tag" >&2; exit 2 ;;
esac
