// CoreDNS with only the plugins the test cluster's DNS needs (scripts/lib/cluster-dns.sh):
// answering for cluster.local from the API server (kubernetes), with errors, log, cache,
// health, ready and bind. Building CoreDNS's own main would compile every plugin (the
// clouds' SDKs among them) for nothing; a main of our own with a plugin list is CoreDNS's
// documented way to choose plugins at compile time.
package main

import (
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

// The plugins in the order CoreDNS's plugin.cfg gives them: a request passes through them in
// this order, whatever the Corefile's order.
var directives = []string{"bind", "ready", "health", "errors", "log", "cache", "kubernetes"}

func init() {
	dnsserver.Directives = directives
}

func main() {
	coremain.Run()
}
