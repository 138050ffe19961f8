package redistest

import (
	"slices"
)

// StartServerWith is StartServer with extra redis-server arguments appended
// after the defaults, so they override them: for example
//
//	s := redistest.StartServerWith(t, "--appendonly", "yes", "--appendfsync", "always")
//
// gives a server whose data survives Kill + Restart. Restart relaunches with
// the same arguments, port and data directory (one TempDir for the
// server's life), so an append-only file written before a crash is loaded
// again. Like StartServer it skips the test when redis-server is missing,
// unless TASKLEASE_REQUIRE_REDIS=1.
func StartServerWith(t T, args ...string) *Server {
	t.Helper()
	bin := requireBinary(t, "redis-server")
	extra := slices.Clone(args) // the caller may reuse its slice
	s := newServer(t, bin, t.TempDir(), func(int) []string { return extra })
	s.startOnFreePort(t, func(t T) int { return FreePort(t) })
	return s
}
