package jobs

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/redistest"
)

// scriptCapture keeps the arguments of every script call a client sends,
// so a test can send one again as go-redis does when it retries a call
// whose reply was lost (MaxRetries): Redis then runs the script twice.
type scriptCapture struct {
	mu   sync.Mutex
	sent [][]any
}

func (c *scriptCapture) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *scriptCapture) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.keep(cmd)
		return next(ctx, cmd)
	}
}

func (c *scriptCapture) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			c.keep(cmd)
		}
		return next(ctx, cmds)
	}
}

func (c *scriptCapture) keep(cmd redis.Cmder) {
	switch strings.ToLower(fmt.Sprint(cmd.Args()[0])) {
	case "fcall", "evalsha", "eval":
		c.mu.Lock()
		c.sent = append(c.sent, slices.Clone(cmd.Args()))
		c.mu.Unlock()
	}
}

// carrying returns the last script call whose arguments mention s.
func (c *scriptCapture) carrying(s string) []any {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(c.sent) - 1; i >= 0; i-- {
		if strings.Contains(fmt.Sprint(c.sent[i]...), s) {
			return c.sent[i]
		}
	}
	return nil
}

// TestSubmitRunAgainAfterItsRunStartedIsARepeat: a queue request whose
// reply is lost is sent again by go-redis after the run it queued has
// started (the run before it ended in between). The repeat carries the
// same run id; it must not queue that run behind itself (a chaos run on a
// lossy network found the follow-up started under the ended run's id: one
// run executed twice, the second time after it was done). Nor may a
// repeated start, once its run is over, start another under the same id.
func TestSubmitRunAgainAfterItsRunStartedIsARepeat(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			capture := &scriptCapture{}
			b.Client.AddHook(capture)
			hold := newClHold(5)
			e := newEnv(t, b.Client, Config{Prefix: "rs", Partitions: 1, Jobs: []Job{clJob("course_sync", Stage{Name: "pulling", Handler: hold})}})
			clStartRunner(e, RunnerConfig{ID: "rs", Concurrency: 2}, 1)

			first := clSubmit(t, e.reg, "u1", "course_sync", SourceManual, PolicyJoin)
			clRecv(t, hold.entered, 5*time.Second, "the first run's stage")
			queued := clSubmit(t, e.reg, "u1", "course_sync", SourceManual, PolicyQueue)
			if queued.Outcome != OutcomeQueued || queued.RunID == first.RunID {
				t.Fatalf("queue request: %+v, want a follow-up behind run %s", queued, first.RunID)
			}
			call := capture.carrying(queued.RunID)
			if call == nil {
				t.Fatal("the queue request's script call was not seen")
			}
			hold.release <- struct{}{} // the first run ends; its follow-up starts
			if got := clRecv(t, hold.entered, 5*time.Second, "the follow-up's stage"); got.RunID() != queued.RunID {
				t.Fatalf("follow-up started as %s, want %s", got.RunID(), queued.RunID)
			}
			// The request again, as a retry after a lost reply sends it.
			if err := e.rdb.Do(ctx, call...).Err(); err != nil {
				t.Fatalf("repeat of the queue request: %v", err)
			}
			hold.release <- struct{}{} // the follow-up ends
			waitFor(t, 5*time.Second, "the follow-up's end in the history", func() bool {
				for _, ev := range clHistory(t, e.reg, "u1", "course_sync") {
					if ev.RunID == queued.RunID && ev.Event == "done" {
						return true
					}
				}
				return false
			})
			v, err := e.reg.Get(ctx, "u1", "course_sync")
			if err != nil {
				t.Fatal(err)
			}
			if v.RunID == queued.RunID && v.Status != StatusDone {
				t.Fatalf("after the follow-up ended: %s is %s again", v.RunID, v.Status)
			}
			if v.Status != StatusDone {
				t.Fatalf("after the follow-up ended: %+v, want done with nothing queued (the repeat was served)", v)
			}
			runs := map[string]int{}
			hold.mu.Lock()
			defer hold.mu.Unlock()
			for _, r := range hold.runs {
				runs[r.RunID()]++
			}
			if runs[queued.RunID] != 1 || len(runs) != 2 {
				t.Fatalf("stage executions by run: %v, want one each of %s and %s", runs, first.RunID, queued.RunID)
			}
			hold.mu.Unlock()

			// A request that started a run, repeated once that run is over.
			started := clSubmit(t, e.reg, "u2", "course_sync", SourceManual, PolicyJoin)
			call = capture.carrying(started.RunID)
			clRecv(t, hold.entered, 5*time.Second, "u2's stage")
			hold.release <- struct{}{}
			e.waitStatus("u2", "course_sync", 5*time.Second, StatusDone)
			if err := e.rdb.Do(ctx, call...).Err(); err != nil {
				t.Fatalf("repeat of u2's request: %v", err)
			}
			if v, err := e.reg.Get(ctx, "u2", "course_sync"); err != nil || v.Status != StatusDone || v.RunID != started.RunID {
				t.Fatalf("u2 after the repeat: %+v %v, want run %s done, nothing started", v, err, started.RunID)
			}

			// A queue request that started a run, repeated once that run
			// is over and another request's run is running: the chaos run
			// of seed 1796677702355026443 (single Redis, replies lost)
			// queued the ended run's id behind the newer run, and it ran
			// twice. The record's prior runs name it.
			x := clSubmit(t, e.reg, "u3", "course_sync", SourceManual, PolicyQueue)
			call = capture.carrying(x.RunID)
			clRecv(t, hold.entered, 5*time.Second, "u3's first run")
			hold.release <- struct{}{}
			e.waitStatus("u3", "course_sync", 5*time.Second, StatusDone)
			y := clSubmit(t, e.reg, "u3", "course_sync", SourceManual, PolicyQueue)
			clRecv(t, hold.entered, 5*time.Second, "u3's second run")
			if err := e.rdb.Do(ctx, call...).Err(); err != nil {
				t.Fatalf("repeat of u3's first request: %v", err)
			}
			hold.release <- struct{}{}
			e.waitStatus("u3", "course_sync", 5*time.Second, StatusDone)
			if v, err := e.reg.Get(ctx, "u3", "course_sync"); err != nil || v.RunID != y.RunID {
				t.Fatalf("u3 after the repeat: %+v %v, want run %s done, nothing queued behind it", v, err, y.RunID)
			}
			hold.mu.Lock()
			n := 0
			for _, r := range hold.runs {
				if r.RunID() == x.RunID {
					n++
				}
			}
			if n != 1 {
				t.Fatalf("run %s of u3 executed %d times, want once", x.RunID, n)
			}
		})
	}
}
