// Takes the place of plugins/plugins.go of the prometheus module at build time (scripts/k8s.sh
// builds a copy of the module with this file in it): that file links in every service
// discovery, each with its cloud SDK, while the Prometheus Operator's configuration uses only
// kubernetes_sd_configs. Module v0.42.0 has no build tags to leave them out (later releases
// do). plugins/minimum.go, kept, adds file and http discovery.

package plugins

import (
	// Register kubernetes plugin.
	_ "github.com/prometheus/prometheus/discovery/kubernetes"
)
