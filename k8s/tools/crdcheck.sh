#!/usr/bin/env bash
# Validate k8s/crd and every CouponEvent in k8s/examples (must be accepted) and
# k8s/tools/crdcheck/testdata (bad-*: must be refused) with the API server's own validation
# code. Needs Go; the first build downloads k8s.io modules and takes several minutes.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
bin="${CRDCHECK_BIN:-$root/.cache/crdcheck}"
mkdir -p "$(dirname "$bin")"
(cd "$here/crdcheck" && go build -o "$bin" .)
"$bin" "$root/k8s/crd/couponevents.flashcoupon.io.yaml" \
  "$root"/k8s/examples/*.yaml "$here"/crdcheck/testdata/*.yaml
