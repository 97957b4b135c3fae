// kube-apiserver from the k8s.io/kubernetes module (every staging module pinned to the same
// release in go.mod), for the dev cluster (scripts/k8s.sh).
// Only for local clusters and checks; it is never deployed.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
