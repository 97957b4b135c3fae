//go:build tools

// The Prometheus server of the dev cluster's Prometheus pod (scripts/k8s.sh builds it into
// .cache/k8s/bin; scripts/k8s-prometheus-image.sh puts it in the image). Module v0.42.0 is
// Prometheus 2.42.0, the release of Debian's promtool, so the rules `make observe-check`
// validates are read by the same PromQL engine here.
//
// Debian's prometheus binary cannot be used in the pod: Debian builds it without the
// kubernetes service discovery, which is all the Prometheus Operator's configuration uses.
package tools

import _ "github.com/prometheus/prometheus/cmd/prometheus"
