// Command etcd is etcd's own server (go.etcd.io/etcd/server/v3/etcdmain) at the version that
// Kubernetes pins in this module's go.mod, for the tests' kube-apiserver (Debian bookworm's
// etcd-server is 3.4, older than current Kubernetes supports).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
