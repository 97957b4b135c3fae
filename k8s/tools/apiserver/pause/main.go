// The pod sandbox's process for the dev cluster (scripts/k8s.sh builds it statically into the
// containerd sandbox image, since no registry serves registry.k8s.io/pause here): it holds the
// pod's namespaces, reaps orphans when it is the pod's PID 1, and exits on SIGINT/SIGTERM.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
