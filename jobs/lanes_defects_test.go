package jobs

import (
	"testing"
	"time"

	"github.com/tasklease/tasklease/internal/redistest"
)

// TestReadOfAnUnknownJobBurnsNothing: during a rolling deploy an older
// runner defines only sync; one read takes a person's request for u1|sync
// (maxAttempts 1) and then one for a1|alien. u1 must run once and end
// done — the read must not raise after granting it — and a1 must be left,
// queued and saying why, to a runner that defines alien, which then runs
// it.
func TestReadOfAnUnknownJobBurnsNothing(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			c := &counter{}
			sync := Job{Scope: "sync", Stages: []Stage{{Name: "pull", Handler: c}}, Retry: RetryPolicy{MaxAttempts: 1}}
			alien := Job{Scope: "alien", Stages: []Stage{{Name: "probe", Handler: c}}}
			newer := newEnv(t, b.Client, Config{Prefix: "ud", Partitions: 1, Jobs: []Job{sync, alien}})
			older := newEnv(t, b.Client, Config{Prefix: "ud", Partitions: 1, Jobs: []Job{sync}})
			clSubmit(t, newer.reg, "u1", "sync", SourceManual, "")
			clSubmit(t, newer.reg, "a1", "alien", SourceManual, "")

			old, _ := older.startRunner(RunnerConfig{ID: "ud-old", LeaseTTL: time.Second})
			v := older.waitStatus("u1", "sync", 10*time.Second, StatusDone, StatusFailed)
			if v.Status != StatusDone || c.get("u1/pull") != 1 {
				t.Fatalf("u1|sync: %s (%s), stage ran %d times; want done, run once", v.Status, v.LastError, c.get("u1/pull"))
			}
			a := newer.waitStatus("a1", "alien", 5*time.Second, StatusQueued)
			want := "waiting for a runner that defines this job (" + old.Owner() + " does not)"
			if a.Waiting != want || c.get("a1/probe") != 0 {
				t.Errorf("a1|alien: waiting %q, probe ran %d times; want %q, never run", a.Waiting, c.get("a1/probe"), want)
			}

			// The newer runner serves it once it comes up.
			newer.startRunner(RunnerConfig{ID: "ud-new", LeaseTTL: time.Second, ReclaimInterval: 20 * time.Millisecond})
			if v := newer.waitStatus("a1", "alien", 10*time.Second, StatusDone, StatusFailed); v.Status != StatusDone {
				t.Errorf("a1|alien: %s (%s), want done", v.Status, v.LastError)
			}
			if n := c.get("a1/probe"); n != 1 {
				t.Errorf("a1|alien: probe ran %d times, want 1", n)
			}
		})
	}
}
