package jobs

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/taskkey"
)

// TestClaimThatGrantsNothingLeavesNoLease: the claim takes the lease first
// (SET NX) and decides after; every decision that grants nothing must drop
// it again, or the key would look held — and block every claim — until the
// TTL passed. One entry per decision: a job this runner does not define
// (foreign), a cancel flag (ack), a retry not due yet (busy), a run whose
// holder vanished on its last attempt (ack, failed).
func TestClaimThatGrantsNothingLeavesNoLease(t *testing.T) {
	for _, b := range redistest.Backends(t, redistest.WithSharedCluster) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			prefix := fmt.Sprintf("cl%d", time.Now().UnixNano())
			both := newEnv(t, b.Client, Config{Prefix: prefix, Partitions: 1, Jobs: []Job{
				{Scope: "alien", Stages: []Stage{{Name: "probe", Handler: noopStage}}},
				{Scope: rcScope, Stages: []Stage{{Name: "work", Handler: noopStage}}, Retry: RetryPolicy{MaxAttempts: 3}},
			}})
			only := newEnv(t, b.Client, Config{Prefix: prefix, Partitions: 1, Jobs: []Job{
				{Scope: rcScope, Stages: []Stage{{Name: "work", Handler: noopStage}}, Retry: RetryPolicy{MaxAttempts: 3}},
			}})
			rn, err := NewRunner(only.reg, RunnerConfig{ID: "cl"})
			if err != nil {
				t.Fatal(err)
			}
			recSubmit(t, both, "a", "alien", OutcomeStarted)
			for _, s := range []string{"cancelled", "backoff", "lost"} {
				recSubmit(t, both, s, rcScope, OutcomeStarted)
			}
			ks := both.reg.ks
			set := func(subject string, kv ...any) {
				k, err := taskkey.New(subject, rcScope)
				if err != nil {
					t.Fatal(err)
				}
				if err := b.Client.HSet(ctx, ks.Task(k), kv...).Err(); err != nil {
					t.Fatal(err)
				}
			}
			set("cancelled", "cancel", "1")
			set("backoff", "status", "retrying", "attempt", 1, "nextAttemptAt", time.Now().Add(time.Hour).UnixMilli())
			set("lost", "status", "running", "attempt", 3, "maxAttempts", 3, "owner", "gone/1", "token", 1)

			want := map[string]string{"a|alien": "foreign", "cancelled|" + rcScope: "ack",
				"backoff|" + rcScope: "busy", "lost|" + rcScope: "ack"}
			es := takeEntries(t, both.reg, 0, 10)
			if len(es) != len(want) {
				t.Fatalf("took %d entries, want %d", len(es), len(want))
			}
			res, err := rn.claim(ctx, 0, es)
			if err != nil {
				t.Fatal(err)
			}
			for i, e := range es {
				if got := string(res[i].kind); got != want[e.key.String()] {
					t.Errorf("%s: claim %s, want %s", e.key, got, want[e.key.String()])
				}
				if n := b.Client.Exists(ctx, ks.Lease(e.key)).Val(); n != 0 {
					t.Errorf("%s: a lease is left after a claim that granted nothing (%s)", e.key, res[i].kind)
				}
			}
			for subject, st := range map[string]Status{"cancelled": StatusCancelled, "lost": StatusFailed, "backoff": StatusRetrying} {
				if v := only.waitStatus(subject, rcScope, 5*time.Second, st); v.Status != st {
					t.Errorf("%s: %s, want %s", subject, v.Status, st)
				}
			}
		})
	}
}
