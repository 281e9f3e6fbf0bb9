// etcd for the one-machine cluster, built from go.etcd.io/etcd/server/v3 at the version
// k8s.io/kubernetes v1.36.3 itself requires (etcd's own main is this one call).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
