package jobs

import (
	"context"
	"testing"

	"github.com/tasklease/tasklease/internal/redistest"
)

// TestFinishClaimsTheNextRunOfItsJob: a finish that takes the next entry
// for its slot claims it in the same script when it is a run of the same
// job (the slot's next run costs no claim call), and leaves an entry of
// another job to a claim with that job's definition.
func TestFinishClaimsTheNextRunOfItsJob(t *testing.T) {
	for _, b := range redistest.Backends(t, redistest.WithSharedCluster) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			c := &counter{}
			e := newEnv(t, b.Client, Config{Prefix: "nc", Partitions: 1, Jobs: []Job{
				clJob("course_sync", Stage{Name: "pulling", Handler: c}), clJob("backup", Stage{Name: "copy", Handler: c})}})
			clSubmit(t, e.reg, "u1", "course_sync", SourceManual, "")
			clSubmit(t, e.reg, "u2", "course_sync", SourceManual, "")
			clSubmit(t, e.reg, "u3", "backup", SourceManual, "")
			rn, err := NewRunner(e.reg, RunnerConfig{ID: "nc", Concurrency: 1})
			if err != nil {
				t.Fatal(err)
			}
			rn.fetchCtx = ctx
			rn.workCtx, rn.workCancel = context.WithCancelCause(ctx)
			defer rn.workCancel(nil)

			es := takeEntries(t, e.reg, 0, 1)
			cl, err := rn.claim(ctx, 0, es)
			if err != nil || cl[0].kind != claimGranted {
				t.Fatalf("claim of u1: %+v %v", cl, err)
			}
			lr := rn.newLocalRun(es[0])
			next, _ := rn.execute(lr, cl[0], true)
			lr.end()
			if len(next) != 1 || next[0].e.key.Subject() != "u2" || next[0].claim == nil || next[0].claim.kind != claimGranted {
				t.Fatalf("after u1: next %+v, want u2 claimed by the finish", next)
			}
			if v, _ := e.reg.Get(ctx, "u2", "course_sync"); v.Status != StatusRunning || v.Owner != rn.Owner() || v.FencingToken != next[0].claim.token {
				t.Errorf("u2 after the finish: %s owner %s token %d, want running, %s, %d", v.Status, v.Owner, v.FencingToken,
					rn.Owner(), next[0].claim.token)
			}
			lr = rn.newLocalRun(next[0].e)
			next, _ = rn.execute(lr, *next[0].claim, true)
			lr.end()
			if len(next) != 1 || next[0].e.key.Subject() != "u3" || next[0].claim != nil {
				t.Fatalf("after u2: next %+v, want u3 taken and not claimed (another job)", next)
			}
			if v, _ := e.reg.Get(ctx, "u3", "backup"); v.Status != StatusQueued {
				t.Errorf("u3 after the finish: %s, want queued until its claim", v.Status)
			}
			lr, c3, _ := rn.claimNext(next)
			if lr == nil || c3.kind != claimGranted {
				t.Fatalf("claim of u3: %+v", c3)
			}
			rn.execute(lr, c3, false)
			lr.end()
			for _, s := range []string{"u1/pulling", "u2/pulling", "u3/copy"} {
				if n := c.get(s); n != 1 {
					t.Errorf("%s ran %d times, want 1", s, n)
				}
			}
		})
	}
}
