#!/usr/bin/env bash
# Command-line tools the deployment checks need, built from the Go module proxy into a
# project-local GOBIN (.cache/bin), so nothing is installed system-wide and a fresh machine
# needs only Go.
#
#   scripts/tools.sh install [NAME...]  build what is missing or at another version: idempotent
#                                       (helm, jaeger; helm when none is named)
#   scripts/tools.sh path helm          print the binary's path (after install)
#
# jaeger (the local trace backend, scripts/tracing.sh) is built from the wrapper module in
# scripts/jaeger: its go.mod pins the Jaeger version and go.sum every dependency's hash.
#
# The one subtle point: a `go install`ed helm carries no build-time Kubernetes version, so its
# `.Capabilities.KubeVersion` is v1.20 unless `--kube-version` is passed (make chart-check does).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE_DIR=${FLASHCOUPON_CACHE_DIR:-$ROOT/.cache}
BIN_DIR=$CACHE_DIR/bin
HELM_VERSION=${HELM_VERSION:-v3.21.4}
JAEGER_MODULE=github.com/jaegertracing/jaeger

log() { printf '[tools %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { printf '[tools] ERROR: %s\n' "$*" >&2; exit 1; }

find_go() {
  command -v go 2>/dev/null || { [ -x /usr/local/go/bin/go ] && echo /usr/local/go/bin/go; } \
    || die "Go is needed to build the tools (https://go.dev/dl/); not found on PATH or /usr/local/go"
}

# The module version a Go binary was built from (`go version -m`), or nothing.
built_version() { # binary module
  [ -x "$1" ] || return 0
  "$(find_go)" version -m "$1" 2>/dev/null | awk -v m="$2" '$1 == "mod" && $2 == m {print $3}'
}

install_go_tool() { # name module package version
  local name=$1 module=$2 package=$3 version=$4
  if [ "$(built_version "$BIN_DIR/$name" "$module")" = "$version" ]; then
    return
  fi
  local t0=$SECONDS
  log "go install $package@$version into $BIN_DIR (a few minutes on 2 cores, once)"
  mkdir -p "$BIN_DIR"
  GOBIN=$BIN_DIR GOFLAGS=-buildvcs=false nice -n 10 "$(find_go)" install "$package@$version"
  log "$name $version built in $((SECONDS - t0))s"
}

# Jaeger's go.mod has a replace directive, which `go install pkg@version` refuses: it is built
# inside scripts/jaeger instead, and its version is the one that module requires.
# `make test` starts this build in the background (make tools-background); the lock makes the
# trace test's own `install jaeger` wait for that build rather than start a second one.
install_jaeger() {
  mkdir -p "$BIN_DIR"
  exec 8>"$BIN_DIR/.jaeger-build.lock"
  flock -n 8 || { log "another process is building jaeger; waiting for it"; flock 8; }
  install_jaeger_locked
  flock -u 8
}

install_jaeger_locked() {
  local dir=$ROOT/scripts/jaeger want have
  want=$(awk -v m="$JAEGER_MODULE" '($1 == m || ($1 == "require" && $2 == m)) {print ($1 == m ? $2 : $3); exit}' "$dir/go.mod")
  have=$(built_version "$BIN_DIR/jaeger" "$JAEGER_MODULE")
  [ "$have" = "$want" ] && return 0
  local t0=$SECONDS
  log "go build jaeger $want (Jaeger v2) into $BIN_DIR (~10 minutes on 2 cores, once)"
  mkdir -p "$BIN_DIR"
  (cd "$dir" && GOFLAGS="-buildvcs=false -mod=readonly" nice -n 10 "$(find_go)" build -trimpath \
    -ldflags "-s -w" -o "$BIN_DIR/jaeger.tmp" "$JAEGER_MODULE/cmd/jaeger")
  mv "$BIN_DIR/jaeger.tmp" "$BIN_DIR/jaeger"
  log "jaeger $want built in $((SECONDS - t0))s"
}

cmd_install() {
  local t0=$SECONDS name names=("$@")
  [ $# -gt 0 ] || names=(helm) # what the deployment scripts and checks call it for
  for name in "${names[@]}"; do
    case $name in
      helm) install_go_tool helm helm.sh/helm/v3 helm.sh/helm/v3/cmd/helm "$HELM_VERSION" ;;
      jaeger) install_jaeger ;;
      *) die "unknown tool '$name' (helm, jaeger)" ;;
    esac
  done
  log "tools ready in $((SECONDS - t0))s ($BIN_DIR)"
}

case "${1:-}" in
  install) shift; cmd_install "$@" ;;
  path)
    [ -x "$BIN_DIR/${2:-}" ] || die "${2:-?} is not installed; run $0 install"
    echo "$BIN_DIR/$2"
    ;;
  *) echo "usage: $0 install [helm|jaeger...] | path NAME" >&2; exit 2 ;;
esac
