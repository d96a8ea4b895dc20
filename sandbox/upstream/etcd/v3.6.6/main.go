// Command etcd: the pinned go.etcd.io/etcd/server/v3's server, for the sandbox's control plane.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
