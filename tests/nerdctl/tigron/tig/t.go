// Package tig is the stand-in of tigron's tig package: only the interface T, which
// *testing.T satisfies. See ../go.mod for why it exists.
package tig

// T is the part of a testing.TB that nerdctl's test helpers call.
type T interface {
	Helper()
	FailNow()
	Fail()
	Log(args ...any)
	Name() string
	TempDir() string
}
