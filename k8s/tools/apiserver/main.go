// A kube-apiserver built from the k8s.io/kubernetes module (every staging module pinned to the
// same release in go.mod), for k8s/tools/live-operator-check.sh: a real API server without a
// cluster. Only for local checks; it is never deployed.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
