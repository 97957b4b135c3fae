//go:build tools

// The dev cluster's Prometheus Operator (scripts/k8s.sh builds it into .cache/k8s/bin): the
// operator, which runs on the node like the control plane, and the config-reloader, which goes
// into the Prometheus image (scripts/k8s-prometheus-image.sh). Both are mains of the
// prometheus-operator module; this file only pins them in go.mod, so `go build` resolves them
// at the version below.
package tools

import (
	_ "github.com/prometheus-operator/prometheus-operator/cmd/operator"
	_ "github.com/prometheus-operator/prometheus-operator/cmd/prometheus-config-reloader"
)
