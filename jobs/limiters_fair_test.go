package jobs

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tasklease/tasklease/internal/redistest"
)

// turnstile is a stage that logs the order in which runs start and holds
// each until the test lets one go (next).
type turnstile struct {
	next chan struct{}
	mu   sync.Mutex
	keys []string
}

func (s *turnstile) RunStage(ctx context.Context, run *Run) error {
	s.mu.Lock()
	s.keys = append(s.keys, run.Subject())
	s.mu.Unlock()
	select {
	case <-s.next:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *turnstile) started() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.keys...)
}

// Tenant acme has thousands of runs waiting for a concurrency-10 limiter;
// each of tenant beta's runs, submitted one after another, starts after at
// most one start of acme's, the one other waiting group. A person's
// request starts at the next free slot. The runs hold their slots until
// the test ends one, so each slot freed is one start, and the order is
// exact. Without the fair share beta's run waits behind acme's backlog.
func TestLimiterFairShare(t *testing.T) {
	backlog := 20000
	if testing.Short() {
		backlog = 3000
	}
	for _, b := range redistest.Backends(t, redistest.WithSharedCluster) {
		if !b.Real { // tens of thousands of runs: too slow for the embedded Lua
			continue
		}
		for _, fair := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/fair=%v", b.Name, fair), func(t *testing.T) {
				ctx := context.Background()
				st := &turnstile{next: make(chan struct{})}
				job := Job{Scope: "sync", Concurrency: 10, Stages: []Stage{{Name: "push", Handler: st}}}
				if fair {
					job.Fairness = Fairness{GroupBy: FairnessSubjectPrefix}
				}
				e := newEnv(t, b.Client, Config{Prefix: fmt.Sprintf("limfair%v", fair), Jobs: []Job{job}})
				subjects := make([]string, backlog)
				for i := range subjects {
					subjects[i] = fmt.Sprintf("acme:u%d", i)
				}
				for i := 0; i < len(subjects); i += 2000 {
					if _, err := e.reg.SubmitMany(ctx, "sync", subjects[i:min(i+2000, len(subjects))], SubmitManyOptions{Source: SourceSchedule}); err != nil {
						t.Fatal(err)
					}
				}
				_, stop1 := e.startRunner(RunnerConfig{ID: "r1", Concurrency: 32})
				_, stop2 := e.startRunner(RunnerConfig{ID: "r2", Concurrency: 32})
				defer func() { close(st.next); stop1(); stop2() }()
				waitFor(t, 60*time.Second, "acme's backlog waiting in the limiter", func() bool {
					ls, err := e.reg.Limiters(ctx)
					return err == nil && len(ls) == 1 && ls[0].Waiting == backlog-10 && ls[0].InUse == 10
				})
				// endOne ends one run and returns the subject that starts in its slot.
				endOne := func() string {
					n := len(st.started())
					st.next <- struct{}{}
					waitFor(t, 10*time.Second, "the next start", func() bool { return len(st.started()) > n })
					return st.started()[n]
				}
				waitingFor := func(subject string) {
					waitFor(t, 10*time.Second, subject+" waiting", func() bool {
						v, err := e.reg.Get(ctx, subject, "sync")
						return err == nil && v.Waiting != ""
					})
				}
				rounds := 20
				if !fair {
					rounds = 1
				}
				for i := range rounds {
					subject := fmt.Sprintf("beta:u%d", i)
					if _, err := e.reg.Submit(ctx, subject, "sync", SubmitOptions{Source: SourceSchedule}); err != nil {
						t.Fatal(err)
					}
					waitingFor(subject)
					others := 0
					for endOne() != subject {
						if others++; others > 1 && fair || others > 50 {
							break
						}
					}
					switch {
					case fair && others > 1:
						t.Fatalf("%s had not started after %d of acme's runs, want at most 1", subject, others)
					case !fair && others <= 50:
						t.Fatalf("without fair share %s started after %d of acme's runs, want behind the backlog", subject, others)
					}
				}
				if !fair {
					return
				}
				// a person's request: the next free slot
				if _, err := e.reg.Submit(ctx, "zeta:u1", "sync", SubmitOptions{Source: SourceManual}); err != nil {
					t.Fatal(err)
				}
				waitingFor("zeta:u1")
				if got := endOne(); got != "zeta:u1" {
					t.Errorf("the slot freed after the manual request went to %s, want the manual run", got)
				}
			})
		}
	}
}
