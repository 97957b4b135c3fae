// CoreDNS for the dev cluster's Service names (scripts/k8s.sh runs it on the node), built from
// its own Go module, kept apart from the kubernetes module so the two dependency graphs never
// have to agree. Only the plugins the dev cluster's Corefile uses are linked in: the default set
// drags in every cloud SDK and triples the build.
package main

import (
	_ "github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"
	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

func main() {
	coremain.Run()
}
