package jobs

// Pause and resume per scope (DESIGN §5): a paused scope accepts requests
// but no runner claims its runs; running runs finish; resume re-queues what
// was parked, on its lane.

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/keyspace"
	"github.com/tasklease/tasklease/internal/redistest"
)

const (
	psPaused = "paused_sync"
	psOther  = "other_sync"
)

func TestPauseHoldsNewRunsAndResumeRunsThem(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			paused, other := &counter{}, &counter{}
			e := newEnv(t, b.Client, Config{Prefix: "ps1", Partitions: 2, Jobs: []Job{
				clJob(psPaused, Stage{Name: "only", Handler: paused}),
				clJob(psOther, Stage{Name: "only", Handler: other}),
			}})
			if err := e.reg.Pause(ctx, psPaused); err != nil {
				t.Fatal(err)
			}
			if err := e.reg.Pause(ctx, "nope"); !errors.Is(err, ErrUnknownScope) {
				t.Fatalf("pause of an unknown scope: %v, want ErrUnknownScope", err)
			}
			if got, err := e.reg.PausedScopes(ctx); err != nil || len(got) != 1 || got[0] != psPaused {
				t.Fatalf("PausedScopes = %v %v", got, err)
			}
			subjects := []string{"a1", "a2", "a3", "a4"}
			for _, s := range subjects {
				if r := clSubmit(t, e.reg, s, psPaused, SourceSchedule, ""); r.Outcome != OutcomeStarted {
					t.Fatalf("%s: %s", s, r.Outcome)
				}
			}
			clSubmit(t, e.reg, "b1", psOther, SourceManual, "")
			e.startRunner(RunnerConfig{ID: "ps1", Concurrency: 4})

			e.waitStatus("b1", psOther, 10*time.Second, StatusDone)
			for _, s := range subjects {
				waitFor(t, 10*time.Second, s+" parked", func() bool {
					v, err := e.reg.Get(ctx, s, psPaused)
					return err == nil && v.Status == StatusQueued && strings.Contains(v.Waiting, "paused")
				})
			}
			if n := paused.get("a1/only") + paused.get("a2/only") + paused.get("a3/only") + paused.get("a4/only"); n != 0 {
				t.Fatalf("%d runs of the paused scope executed", n)
			}
			// The parked runs left the queues: nobody reads or reclaims them.
			var parked int64
			for p := range 2 {
				if lines, empty := queueState(ctx, e.rdb, e.reg, p); !empty {
					t.Errorf("partition %d: entries left in the queue: %v", p, lines)
				}
				parked += e.rdb.ZCard(ctx, e.reg.ks.Parked(p)).Val()
			}
			if parked != 4 {
				t.Fatalf("%d runs parked, want 4", parked)
			}
			// Requests are still accepted and coalesced by key; a person's
			// join promotes the parked bulk run to the people lane.
			if r := clSubmit(t, e.reg, "a2", psPaused, SourceManual, ""); r.Outcome != OutcomeJoined {
				t.Fatalf("join on a parked run: %s", r.Outcome)
			}
			if raw := clRaw(t, e.reg, "a2", psPaused); raw["lane"] != "p" || raw["plane"] != "p" {
				t.Errorf("joined parked run: lane %q plane %q, want p and p", raw["lane"], raw["plane"])
			}
			// A parked run can be cancelled; resume does not bring it back.
			if o, err := e.reg.Cancel(ctx, "a3", psPaused); err != nil || o != CancelCancelled {
				t.Fatalf("cancel of a parked run: %s %v", o, err)
			}

			n, err := e.reg.Resume(ctx, psPaused)
			if err != nil || n != 3 {
				t.Fatalf("Resume = %d %v, want 3 re-queued", n, err)
			}
			for _, s := range []string{"a1", "a2", "a4"} {
				v := e.waitStatus(s, psPaused, 10*time.Second, StatusDone)
				if v.Waiting != "" {
					t.Errorf("%s: waiting %q after resume", s, v.Waiting)
				}
				if got := paused.get(s + "/only"); got != 1 {
					t.Errorf("%s executed %d times, want 1", s, got)
				}
			}
			if v := e.waitStatus("a3", psPaused, time.Second, StatusCancelled); paused.get("a3/only") != 0 {
				t.Errorf("cancelled parked run executed (%s)", v.Status)
			}
			for p := range 2 {
				if n := e.rdb.ZCard(ctx, e.reg.ks.Parked(p)).Val(); n != 0 {
					t.Errorf("partition %d: %d parked members left after resume", p, n)
				}
			}
			if got, _ := e.reg.PausedScopes(ctx); len(got) != 0 {
				t.Errorf("PausedScopes after resume = %v", got)
			}
			if n, err := e.reg.Resume(ctx, psPaused); err != nil || n != 0 {
				t.Errorf("second Resume = %d %v, want 0", n, err)
			}
		})
	}
}

// A run executing when its scope is paused finishes; the next request of
// the scope waits.
func TestPauseLetsRunningRunsFinish(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			g := newGate()
			e := newEnv(t, b.Client, Config{Prefix: "ps2", Partitions: 1, Jobs: []Job{clJob(psPaused, Stage{Name: "only", Handler: g})}})
			e.startRunner(RunnerConfig{ID: "ps2", Concurrency: 2})
			clSubmit(t, e.reg, "r1", psPaused, SourceManual, "")
			e.waitStatus("r1", psPaused, 10*time.Second, StatusRunning)
			if err := e.reg.Pause(ctx, psPaused); err != nil {
				t.Fatal(err)
			}
			clSubmit(t, e.reg, "r2", psPaused, SourceManual, "")
			waitFor(t, 10*time.Second, "r2 parked", func() bool {
				v, err := e.reg.Get(ctx, "r2", psPaused)
				return err == nil && strings.Contains(v.Waiting, "paused")
			})
			g.open()
			e.waitStatus("r1", psPaused, 10*time.Second, StatusDone)
			if v, _ := e.reg.Get(ctx, "r2", psPaused); v.Status != StatusQueued {
				t.Fatalf("r2 %s while paused, want queued", v.Status)
			}
			if n, err := e.reg.Resume(ctx, psPaused); err != nil || n != 1 {
				t.Fatalf("Resume = %d %v", n, err)
			}
			e.waitStatus("r2", psPaused, 10*time.Second, StatusDone)
			if c := g.count(); c != 2 {
				t.Errorf("%d executions, want 2", c)
			}
		})
	}
}

// parkDuringRead is a go-redis hook that calls fn once, right after the
// first read of a partition's parked set: the moment a claim can park a
// run while Resume is under way.
type parkDuringRead struct {
	once sync.Once
	fn   func()
}

func (h *parkDuringRead) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *parkDuringRead) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *parkDuringRead) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if cmd.Name() == "zrangebylex" {
			h.once.Do(h.fn)
		}
		return err
	}
}

// A run a claim parks after Resume read the (empty) parked set of its
// partition, but before Resume's script unpaused the partition, is
// re-queued too (chaos, cluster: a key stayed "scope sync is paused" for
// good when the last pause of a run was resumed within milliseconds).
func TestResumeRequeuesARunParkedWhileItReads(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			cfg := Config{Prefix: "ps3", Partitions: 1, Jobs: []Job{clJob(psPaused, Stage{Name: "only", Handler: &counter{}})}}
			admin := newEnv(t, b.Client, cfg)
			rn, err := NewRunner(admin.reg, RunnerConfig{ID: "ps3"})
			if err != nil {
				t.Fatal(err)
			}
			if err := admin.reg.Pause(ctx, psPaused); err != nil {
				t.Fatal(err)
			}
			// The resuming process: its read of the parked set lets a claim
			// park a run of the paused scope before it goes on.
			rc := redis.NewClient(b.Client.(*redis.Client).Options())
			t.Cleanup(func() { rc.Close() })
			rc.AddHook(&parkDuringRead{fn: func() {
				clSubmit(t, admin.reg, "late", psPaused, SourceManual, "")
				es := takeEntries(t, admin.reg, 0, 10)
				if len(es) != 1 {
					t.Fatalf("read of the late request: %v", es)
				}
				claims, err := rn.claim(ctx, 0, es)
				if err != nil || claims[0].kind != claimPaused {
					t.Fatalf("claim of the late request: %+v %v, want it parked", claims, err)
				}
			}})
			resumer := newEnv(t, rc, cfg)
			if n, err := resumer.reg.Resume(ctx, psPaused); err != nil || n != 1 {
				t.Fatalf("Resume = %d %v, want the late run re-queued", n, err)
			}
			v, err := admin.reg.Get(ctx, "late", psPaused)
			if err != nil || v.Status != StatusQueued || v.Waiting != "" {
				t.Fatalf("late run after resume: %+v %v, want queued and not waiting", v, err)
			}
			if n := admin.rdb.ZCard(ctx, admin.reg.ks.Parked(0)).Val(); n != 0 {
				t.Errorf("%d runs still parked", n)
			}
			if n := admin.rdb.LLen(ctx, admin.reg.ks.Queue(0, keyspace.LanePeople)).Val(); n != 1 {
				t.Errorf("%d entries in the people lane, want the late run's", n)
			}
		})
	}
}
