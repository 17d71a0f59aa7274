// A stand-in for nerdctl's test framework module (github.com/containerd/nerdctl/mod/tigron).
// nerdctl's own go.mod requires it as v0.0.0 and replaces it with ./mod/tigron, a nested
// module that the published nerdctl module zip leaves out and the Go module proxy does not
// serve. The nerdctl binary links one thing of it: the interface tig.T, named by a test
// helper (pkg/testutil/compose.go) that cmd/nerdctl/helpers imports. This module provides
// that interface and nothing else.
module github.com/containerd/nerdctl/mod/tigron

go 1.26.0
