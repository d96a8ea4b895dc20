//go:build tools

// Package tools names the upstream command this module builds, so that `go mod tidy` keeps its dependencies.
package tools

import (
	_ "sigs.k8s.io/dra-example-driver/cmd/dra-example-kubeletplugin"
)
