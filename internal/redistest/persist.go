package redistest

import (
	"fmt"
	"os"
	"path/filepath"
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

// WipeData deletes what a persistent server wrote to its data directory
// (the append-only files and any RDB snapshot), so the next Restart comes
// up empty: a Redis that lost its disk. Call it between Kill and Restart.
func (s *Server) WipeData() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.runningLocked() {
		return fmt.Errorf("redistest: WipeData of %s while it is running", s.addrLocked())
	}
	for _, name := range []string{"appendonlydir", "appendonly.aof", "dump.rdb"} {
		if err := os.RemoveAll(filepath.Join(s.dir, name)); err != nil {
			return fmt.Errorf("redistest: wipe %s: %w", name, err)
		}
	}
	return nil
}
