//go:build unix

package jobs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/leasing"
	"github.com/tasklease/tasklease/taskkey"
)

// Recovery tests: retries, timeouts, cancel, hand-back on shutdown, and the
// failures of Redis and of lease holders. Each runs on miniredis, a real
// redis-server and a real 3-master Cluster (redistest.Backends; the
// test binary's shared cluster unless the test must break its own), except
// where its comment says why not. On miniredis the clock is frozen
// (retries only become due when the test advances it); on real Redis time
// passes, so retries there back off long enough to be seen (recRetryOn).

// recWaitView polls the task's view until cond holds.
func recWaitView(t *testing.T, e *testEnv, subject, scope string, d time.Duration, what string, cond func(TaskView) bool) TaskView {
	t.Helper()
	var v TaskView
	waitFor(t, d, subject+"|"+scope+": "+what, func() bool {
		var err error
		v, err = e.reg.Get(context.Background(), subject, scope)
		if err != nil && !errors.Is(err, ErrNotFound) {
			t.Fatal(err)
		}
		return cond(v)
	})
	return v
}

// recHistory returns the key's history, oldest first.
func recHistory(t *testing.T, e *testEnv, subject, scope string) []Event {
	t.Helper()
	ev, err := e.reg.History(context.Background(), subject, scope, 1000)
	if err != nil {
		t.Fatal(err)
	}
	slices.Reverse(ev)
	return ev
}

func recEvents(ev []Event, name string) []Event {
	var out []Event
	for _, e := range ev {
		if e.Event == name {
			out = append(out, e)
		}
	}
	return out
}

func recEventNames(ev []Event) string {
	names := make([]string, len(ev))
	for i, e := range ev {
		names[i] = e.Event
		if e.Outcome != "" {
			names[i] += "(" + e.Outcome + ")"
		}
	}
	return strings.Join(names, " ")
}

func recSubmit(t *testing.T, e *testEnv, subject, scope string, want Outcome) SubmitResult {
	t.Helper()
	res, err := e.reg.Submit(context.Background(), subject, scope, SubmitOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Outcome != want {
		t.Fatalf("submit %s|%s: outcome %s, want %s", subject, scope, res.Outcome, want)
	}
	return res
}

// stageSeen is what a stage handler observed of its Run.
type stageSeen struct {
	owner   string
	attempt int
	source  Source
	resumed bool
	cursor  string
	token   int64
	cause   error // context.Cause once the stage context ended, if it did
}

func seeRun(run *Run) stageSeen {
	return stageSeen{owner: run.Owner(), attempt: run.Attempt(), source: run.Source(),
		resumed: run.Resumed(), cursor: string(run.Cursor()), token: run.FencingToken()}
}

// seenLog collects stageSeen values from concurrent handlers.
type seenLog struct {
	mu  sync.Mutex
	all []stageSeen
}

func (l *seenLog) add(s stageSeen) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.all = append(l.all, s)
}

func (l *seenLog) get() []stageSeen {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.all)
}

var recRetry = RetryPolicy{MaxAttempts: 3, Backoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}

// recRetryOn is the retry policy of a test on b. On miniredis it is
// recRetry: the frozen clock holds a scheduled retry until the test makes
// it due (recRetryDue). On real Redis the retry comes due by itself, so
// its backoff is long enough (due 500 ms to 1 s after the failure, by
// jitter) for the test to see the run retrying first.
func recRetryOn(b redistest.Backend) RetryPolicy {
	if !b.Real {
		return recRetry
	}
	return RetryPolicy{MaxAttempts: recRetry.MaxAttempts, Backoff: time.Second, MaxBackoff: time.Second}
}

// recRetryDue makes a retry scheduled under recRetryOn(b) due: miniredis's
// clock jumps past it; real Redis gets there in real time, which the
// test's next wait covers (waiting here would only eat into the time the
// next attempt is seen retrying).
func recRetryDue(b redistest.Backend) {
	if !b.Real {
		b.Advance(time.Second)
	}
}

// TestRecoveryRetriesResumeFromCheckpoint: an attempt that fails after
// saving progress is retried from the checkpoint: the done stage is not run
// again and the failed stage sees its cursor, as attempt 2 with source retry.
func TestRecoveryRetriesResumeFromCheckpoint(t *testing.T) {
	for _, b := range redistest.Backends(t, redistest.WithSharedCluster) {
		t.Run(b.Name, func(t *testing.T) {
			var pull, commit counter
			var push seenLog
			pushing := HandlerFunc(func(ctx context.Context, run *Run) error {
				push.add(seeRun(run))
				if run.Attempt() == 1 {
					if err := run.SaveProgress(ctx, []byte("half")); err != nil {
						return Permanent(err)
					}
					return errors.New("push: upstream answered 503")
				}
				return nil
			})
			retry := recRetryOn(b)
			e := newEnv(t, b.Client, Config{Prefix: "rec-retry-resume", Jobs: []Job{{
				Scope: "course_sync", Retry: retry,
				Stages: []Stage{{Name: "pulling", Handler: &pull}, {Name: "pushing", Handler: pushing}, {Name: "commit", Handler: &commit}},
			}}})
			e.startRunner(RunnerConfig{ID: "rec-a"})
			recSubmit(t, e, "u1", "course_sync", OutcomeStarted)

			// The retry is not due yet (miniredis: the clock is frozen): the
			// run waits in retrying, where the view shows why and when it
			// goes again.
			v := e.waitStatus("u1", "course_sync", 10*time.Second, StatusRetrying, StatusDone, StatusFailed)
			if v.Status != StatusRetrying {
				t.Fatalf("after a failed attempt: status %s, want retrying (view %+v)", v.Status, v)
			}
			if v.NextAttemptAt == nil || v.UpdatedAt == nil || !v.NextAttemptAt.After(*v.UpdatedAt) {
				t.Errorf("retrying view: nextAttemptAt %v, updatedAt %v; want a due time after the failure", v.NextAttemptAt, v.UpdatedAt)
			} else if d := v.NextAttemptAt.Sub(*v.UpdatedAt); d > retry.MaxBackoff {
				t.Errorf("retry due after %s, more than maxBackoff %s", d, retry.MaxBackoff)
			}
			if !strings.Contains(v.LastError, "upstream answered 503") {
				t.Errorf("retrying view: lastError %q, want the stage error", v.LastError)
			}
			if v.Attempt != 1 || !slices.Equal(v.CompletedStages, []string{"pulling"}) {
				t.Errorf("retrying view: attempt %d, completed %v; want 1, [pulling]", v.Attempt, v.CompletedStages)
			}

			recRetryDue(b)
			v = e.waitStatus("u1", "course_sync", 10*time.Second, StatusDone, StatusFailed)
			if v.Status != StatusDone {
				t.Fatalf("status %s, want done (lastError %q)", v.Status, v.LastError)
			}
			if n := pull.get("u1/pulling"); n != 1 {
				t.Errorf("stage pulling ran %d times, want 1 (a done stage must not run again)", n)
			}
			if n := commit.get("u1/commit"); n != 1 {
				t.Errorf("stage commit ran %d times, want 1", n)
			}
			seen := push.get()
			if len(seen) != 2 {
				t.Fatalf("stage pushing ran %d times, want 2", len(seen))
			}
			if s := seen[0]; s.attempt != 1 || s.resumed || s.cursor != "" || s.source != SourceManual {
				t.Errorf("attempt 1 saw %+v; want attempt 1, not resumed, no cursor, source manual", s)
			}
			if s := seen[1]; s.attempt != 2 || !s.resumed || s.cursor != "half" || s.source != SourceRetry {
				t.Errorf("attempt 2 saw %+v; want attempt 2, resumed, cursor \"half\", source retry", s)
			}
			if seen[1].token <= seen[0].token {
				t.Errorf("fencing token went from %d to %d; want an increase per grant", seen[0].token, seen[1].token)
			}
			ev := recHistory(t, e, "u1", "course_sync")
			if n := len(recEvents(ev, "retry-scheduled")); n != 1 {
				t.Errorf("history has %d retry-scheduled events, want 1: %s", n, recEventNames(ev))
			}
			if n := len(recEvents(ev, "done")); n != 1 {
				t.Errorf("history has %d done events, want 1: %s", n, recEventNames(ev))
			}
		})
	}
}

// TestRecoveryStopsAtMaxAttempts: an always failing stage runs exactly
// maxAttempts times, then the run fails with the stage's error.
func TestRecoveryStopsAtMaxAttempts(t *testing.T) {
	for _, b := range redistest.Backends(t, redistest.WithSharedCluster) {
		t.Run(b.Name, func(t *testing.T) {
			var runs atomic.Int32
			failing := HandlerFunc(func(ctx context.Context, run *Run) error {
				runs.Add(1)
				return fmt.Errorf("disk full (attempt %d)", run.Attempt())
			})
			e := newEnv(t, b.Client, Config{Prefix: "rec-max-attempts", Jobs: []Job{{
				Scope: "backup", Retry: recRetryOn(b), Stages: []Stage{{Name: "copying", Handler: failing}},
			}}})
			e.startRunner(RunnerConfig{ID: "rec-a"})
			recSubmit(t, e, "u1", "backup", OutcomeStarted)

			last := 0
			var v TaskView
			for {
				v = recWaitView(t, e, "u1", "backup", 10*time.Second, "next attempt ends", func(v TaskView) bool {
					return (v.Status == StatusRetrying && v.Attempt > last) || v.Status == StatusFailed || v.Status == StatusDone
				})
				if v.Status != StatusRetrying {
					break
				}
				if v.Attempt > recRetry.MaxAttempts {
					t.Fatalf("attempt %d is retrying, beyond maxAttempts %d", v.Attempt, recRetry.MaxAttempts)
				}
				last = v.Attempt
				recRetryDue(b)
			}
			if v.Status != StatusFailed {
				t.Fatalf("status %s, want failed", v.Status)
			}
			if n := runs.Load(); n != 3 {
				t.Errorf("stage ran %d times, want exactly maxAttempts = 3", n)
			}
			if v.Attempt != 3 || v.MaxAttempts != 3 {
				t.Errorf("view attempt %d of %d, want 3 of 3", v.Attempt, v.MaxAttempts)
			}
			if !strings.Contains(v.LastError, "disk full (attempt 3)") {
				t.Errorf("lastError %q, want the last stage error", v.LastError)
			}
			if v.FinishedAt == nil || v.NextAttemptAt != nil {
				t.Errorf("failed view: finishedAt %v nextAttemptAt %v; want finishedAt set, no next attempt", v.FinishedAt, v.NextAttemptAt)
			}
			ev := recHistory(t, e, "u1", "backup")
			if n := len(recEvents(ev, "retry-scheduled")); n != 2 {
				t.Errorf("history has %d retry-scheduled events, want 2: %s", n, recEventNames(ev))
			}
			failed := recEvents(ev, "failed")
			if len(failed) != 1 {
				t.Fatalf("history has %d failed events, want 1: %s", len(failed), recEventNames(ev))
			}
			if !strings.Contains(failed[0].Error, "disk full") {
				t.Errorf("failed event error %q, want the stage error", failed[0].Error)
			}
		})
	}
}

// TestRecoveryPermanentErrorsFailAtOnce: errors marked permanent, and a
// downstream's stale-token rejection, fail the run on the first attempt.
func TestRecoveryPermanentErrorsFailAtOnce(t *testing.T) {
	cases := []struct {
		name string
		err  error
	}{
		{"permanent", Permanent(errors.New("invalid credentials"))},
		{"stale-token", fmt.Errorf("push rejected: %w", ErrStaleToken)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, b := range redistest.Backends(t, redistest.WithSharedCluster) {
				t.Run(b.Name, func(t *testing.T) {
					var runs atomic.Int32
					h := HandlerFunc(func(ctx context.Context, run *Run) error {
						runs.Add(1)
						return c.err
					})
					e := newEnv(t, b.Client, Config{Prefix: "rec-permanent-" + c.name, Jobs: []Job{{
						Scope: "course_sync", Retry: recRetryOn(b), Stages: []Stage{{Name: "pushing", Handler: h}},
					}}})
					e.startRunner(RunnerConfig{ID: "rec-a"})
					recSubmit(t, e, "u1", "course_sync", OutcomeStarted)
					// A retryable error would leave the run in retrying (on
					// miniredis the frozen clock never makes the retry due; on
					// real Redis it is not due for at least 500 ms).
					v := e.waitStatus("u1", "course_sync", 10*time.Second, StatusFailed, StatusRetrying, StatusDone)
					if v.Status != StatusFailed {
						t.Fatalf("status %s, want failed at once", v.Status)
					}
					if n := runs.Load(); n != 1 || v.Attempt != 1 {
						t.Errorf("ran %d times, attempt %d; want 1, 1", n, v.Attempt)
					}
					if !strings.Contains(v.LastError, c.err.Error()) {
						t.Errorf("lastError %q, want %q", v.LastError, c.err.Error())
					}
					ev := recHistory(t, e, "u1", "course_sync")
					if n := len(recEvents(ev, "retry-scheduled")); n != 0 {
						t.Errorf("history has %d retry-scheduled events, want 0: %s", n, recEventNames(ev))
					}
				})
			}
		})
	}
}

// TestRecoveryStageTimeoutRetried: a stage over its Timeout has its context
// cancelled; the attempt fails and is retried, whether the handler returns
// the context's error or (wrongly) nil after its deadline.
func TestRecoveryStageTimeoutRetried(t *testing.T) {
	for _, returnNil := range []bool{false, true} {
		name := "returns-cause"
		if returnNil {
			name = "returns-nil"
		}
		t.Run(name, func(t *testing.T) {
			for _, b := range redistest.Backends(t, redistest.WithSharedCluster) {
				t.Run(b.Name, func(t *testing.T) {
					var log seenLog
					var took atomic.Int64
					h := HandlerFunc(func(ctx context.Context, run *Run) error {
						s := seeRun(run)
						if run.Attempt() > 1 {
							log.add(s)
							return nil
						}
						start := time.Now()
						<-ctx.Done()
						took.Store(int64(time.Since(start)))
						s.cause = context.Cause(ctx)
						log.add(s)
						if returnNil {
							return nil
						}
						return s.cause
					})
					const timeout = 50 * time.Millisecond
					e := newEnv(t, b.Client, Config{Prefix: "rec-timeout-" + name, Jobs: []Job{{
						Scope: "course_sync", Retry: recRetryOn(b),
						Stages: []Stage{{Name: "pulling", Timeout: timeout, Handler: h}},
					}}})
					e.startRunner(RunnerConfig{ID: "rec-a"})
					recSubmit(t, e, "u1", "course_sync", OutcomeStarted)

					v := e.waitStatus("u1", "course_sync", 10*time.Second, StatusRetrying, StatusFailed, StatusDone)
					if v.Status != StatusRetrying {
						t.Fatalf("status %s after a timed-out attempt, want retrying", v.Status)
					}
					if !strings.Contains(v.LastError, "timed out") {
						t.Errorf("lastError %q, want a timeout", v.LastError)
					}
					// The timer starts just before the handler is called.
					if d := time.Duration(took.Load()); d < timeout/2 {
						t.Errorf("stage context ended after %s, well before its %s timeout", d, timeout)
					}
					recRetryDue(b)
					v = e.waitStatus("u1", "course_sync", 10*time.Second, StatusDone, StatusFailed)
					if v.Status != StatusDone {
						t.Fatalf("status %s, want done on the retry", v.Status)
					}
					seen := log.get()
					if len(seen) != 2 {
						t.Fatalf("stage ran %d times, want 2", len(seen))
					}
					if c := seen[0].cause; c == nil || !strings.Contains(c.Error(), "timed out") {
						t.Errorf("attempt 1 context cause %v, want the stage timeout", c)
					}
					if seen[1].attempt != 2 || seen[1].source != SourceRetry {
						t.Errorf("second execution %+v, want attempt 2 from retry", seen[1])
					}
				})
			}
		})
	}
}

// recWaitPID waits until path holds a complete pid line.
func recWaitPID(t *testing.T, path string) int {
	t.Helper()
	var pid int
	waitFor(t, 10*time.Second, "pid file "+path, func() bool {
		b, err := os.ReadFile(path)
		if err != nil || !strings.HasSuffix(string(b), "\n") {
			return false
		}
		pid, err = strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		return true
	})
	return pid
}

// TestRecoveryCancelStopsExecProcess: cancelling through the registry
// stops an exec stage's process and ends the run cancelled.
func TestRecoveryCancelStopsExecProcess(t *testing.T) {
	for _, b := range redistest.Backends(t, redistest.WithSharedCluster) {
		t.Run(b.Name, func(t *testing.T) {
			pidFile := filepath.Join(t.TempDir(), "stage.pid")
			stage := &ExecStage{Command: []string{"sh", "-c", "echo $$ > '" + pidFile + "'; exec sleep 60"}}
			e := newEnv(t, b.Client, Config{Prefix: "rec-cancel-exec", Jobs: []Job{{
				Scope: "backup", Retry: recRetry, Stages: []Stage{{Name: "copying", Handler: stage}},
			}}})
			// The heartbeat (every TTL/3) would also deliver the cancel flag if the
			// publish were missed. The lease is kept by the frozen clock
			// (miniredis) or by the heartbeat (real Redis).
			e.startRunner(RunnerConfig{ID: "rec-a", LeaseTTL: 3 * time.Second})
			recSubmit(t, e, "u1", "backup", OutcomeStarted)

			pid := recWaitPID(t, pidFile)
			t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) }) // never leak it
			if err := syscall.Kill(pid, 0); err != nil {
				t.Fatalf("stage process %d not running before cancel: %v", pid, err)
			}
			if v := e.waitStatus("u1", "backup", 5*time.Second, StatusRunning); v.Stage != "copying" {
				t.Fatalf("running view stage %q, want copying", v.Stage)
			}
			out, err := e.reg.Cancel(context.Background(), "u1", "backup")
			if err != nil {
				t.Fatal(err)
			}
			if out != CancelCancelling {
				t.Fatalf("cancel outcome %s, want %s", out, CancelCancelling)
			}
			v := e.waitStatus("u1", "backup", 10*time.Second, StatusCancelled, StatusFailed, StatusDone, StatusRetrying)
			if v.Status != StatusCancelled {
				t.Fatalf("status %s after cancel, want cancelled (lastError %q)", v.Status, v.LastError)
			}
			waitFor(t, 5*time.Second, fmt.Sprintf("stage process %d gone", pid), func() bool {
				return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
			})
			ev := recHistory(t, e, "u1", "backup")
			if n := len(recEvents(ev, "cancelled")); n != 1 {
				t.Errorf("history has %d cancelled events, want 1: %s", n, recEventNames(ev))
			}
		})
	}
}

// TestRecoveryShutdownHandsBack: a runner shutting down with a run still
// executing after its grace hands the run back — lease released, checkpoint
// kept, request re-queued, attempt not consumed — and another runner resumes
// it at once instead of waiting for the lease TTL.
func TestRecoveryShutdownHandsBack(t *testing.T) {
	for _, b := range redistest.Backends(t, redistest.WithSharedCluster) {
		t.Run(b.Name, func(t *testing.T) {
			var pull counter
			var push seenLog
			pushing := recHoldOnA(&push)
			e := newEnv(t, b.Client, Config{Prefix: "rec-handback", Jobs: []Job{{
				Scope: "course_sync", Retry: recRetry,
				Stages: []Stage{{Name: "pulling", Handler: &pull}, {Name: "pushing", Handler: pushing}},
			}}})
			const ttl = 30 * time.Second
			_, stopA := e.startRunner(RunnerConfig{ID: "rec-a", LeaseTTL: ttl, ShutdownGrace: 100 * time.Millisecond})
			recSubmit(t, e, "u1", "course_sync", OutcomeStarted)
			waitFor(t, 10*time.Second, "runner A in stage pushing", func() bool { return len(push.get()) == 1 })
			if v, _ := e.reg.Get(context.Background(), "u1", "course_sync"); v.Status != StatusRunning || v.Attempt != 1 {
				t.Fatalf("before shutdown: status %s attempt %d, want running 1", v.Status, v.Attempt)
			}

			stopA()
			seen := push.get()
			if len(seen) != 2 || !errors.Is(seen[1].cause, ErrShutdown) {
				t.Fatalf("runner A's stage: %+v; want its context cancelled with ErrShutdown", seen)
			}
			v, err := e.reg.Get(context.Background(), "u1", "course_sync")
			if err != nil {
				t.Fatal(err)
			}
			if v.Status != StatusQueued || v.Attempt != 0 || !slices.Equal(v.CompletedStages, []string{"pulling"}) {
				t.Fatalf("after hand-back: status %s attempt %d completed %v; want queued, 0 (attempt given back), [pulling]",
					v.Status, v.Attempt, v.CompletedStages)
			}
			k := taskkey.MustNew("u1", "course_sync")
			if n, err := e.rdb.Exists(context.Background(), e.reg.ks.Lease(k)).Result(); err != nil || n != 0 {
				t.Fatalf("lease key exists = %d (%v) after hand-back; want released", n, err)
			}
			ev := recHistory(t, e, "u1", "course_sync")
			hb := recEvents(ev, "handed-back")
			if len(hb) != 1 || hb[0].Stage != "pushing" || !strings.HasPrefix(hb[0].Owner, "rec-a/") {
				t.Fatalf("handed-back events %+v; want one, at stage pushing, by runner A: %s", hb, recEventNames(ev))
			}

			start := time.Now()
			e.startRunner(RunnerConfig{ID: "rec-b", LeaseTTL: ttl})
			v = e.waitStatus("u1", "course_sync", 10*time.Second, StatusDone, StatusFailed, StatusRetrying)
			took := time.Since(start)
			if v.Status != StatusDone {
				t.Fatalf("status %s, want done", v.Status)
			}
			t.Logf("runner B finished the handed-back run %s after it started (lease TTL %s)", took, ttl)
			if took > ttl/6 {
				t.Errorf("runner B took %s to finish the handed-back run; it must not wait for the %s lease", took, ttl)
			}
			if n := pull.get("u1/pulling"); n != 1 {
				t.Errorf("stage pulling ran %d times, want 1", n)
			}
			seen = push.get()
			if len(seen) != 3 {
				t.Fatalf("stage pushing entered %d times, want 2 (A, then B): %+v", len(seen)-1, seen)
			}
			sb := seen[2]
			if !strings.HasPrefix(sb.owner, "rec-b/") || !sb.resumed || sb.attempt != 1 || sb.token <= seen[0].token {
				t.Errorf("runner B's stage saw %+v; want owner rec-b, resumed, attempt 1, token > %d", sb, seen[0].token)
			}
		})
	}
}

// TestRecoveryScriptFlushMidRun: SCRIPT FLUSH and FUNCTION FLUSH while a
// run is executing only cost a reload (EVAL fallback, or FUNCTION LOAD);
// the run completes.
func TestRecoveryScriptFlushMidRun(t *testing.T) {
	// Its own cluster (WithCluster), not the shared one: it flushes the
	// engine's code, under every other test running there.
	for _, b := range redistest.Backends(t, redistest.WithCluster) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			g := newGate()
			var push counter
			e := newEnv(t, b.Client, Config{Prefix: "rec-flush-" + b.Name, Jobs: []Job{{
				Scope: "course_sync", Retry: recRetry,
				Stages: []Stage{{Name: "pulling", Handler: g}, {Name: "pushing", Handler: &push}},
			}}})
			e.startRunner(RunnerConfig{ID: "rec-flush"})
			recSubmit(t, e, "u1", "course_sync", OutcomeStarted)
			waitFor(t, 10*time.Second, "stage pulling entered", func() bool { return g.count() == 1 })

			// The engine's code is in Redis as a Functions library (Redis 7)
			// or as cached scripts (miniredis): flush both.
			readSHA := e.reg.scripts.readNext.Hash() // the read that took and claimed u1's run
			libs, err := b.Client.FunctionList(ctx, redis.FunctionListQuery{}).Result()
			functions := err == nil
			cached, _ := b.Client.ScriptExists(ctx, readSHA).Result()
			if functions && len(libs) == 0 || !functions && (len(cached) != 1 || !cached[0]) {
				t.Fatalf("engine code not in Redis before the flush: libraries %v (%v), read_next cached %v", libs, err, cached)
			}
			if err := b.Client.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			if functions {
				if err := b.Client.FunctionFlush(ctx).Err(); err != nil {
					t.Fatal(err)
				}
			}
			if ok, err := b.Client.ScriptExists(ctx, readSHA).Result(); err != nil || ok[0] {
				t.Fatalf("read_next script still cached after SCRIPT FLUSH: %v %v", ok, err)
			}
			g.open()
			v := e.waitStatus("u1", "course_sync", 10*time.Second, StatusDone, StatusFailed, StatusRetrying)
			if v.Status != StatusDone || v.Attempt != 1 {
				t.Fatalf("status %s attempt %d (lastError %q), want done on attempt 1", v.Status, v.Attempt, v.LastError)
			}
			if n := push.get("u1/pushing"); n != 1 {
				t.Errorf("stage pushing ran %d times, want 1", n)
			}
		})
	}
}

// TestRecoveryRedisRestartMidRun: a Redis crash (SIGKILL) and restart with
// an fsync-always append-only file loses no run: running and queued runs all
// end done once the runners have reconnected. "blip": Redis is back before
// any holder gives up its lease. "outage": Redis stays down until every
// holder has stopped its stage on lease loss, so the runs are recovered from
// their checkpoints after the restart.
//
// Real redis-server only: miniredis has no persistence to restart from,
// and redistest starts cluster nodes without an append-only file (nor a
// way to ask for one), so a crashed node comes back empty — that case is
// TestRecoveryRedisRestartEmptyRecreatesGroups/cluster, and a cluster
// losing a master without losing data is cluster_failover_test.go.
func TestRecoveryRedisRestartMidRun(t *testing.T) {
	for _, outage := range []bool{false, true} {
		name := "blip"
		if outage {
			name = "outage"
		}
		t.Run(name, func(t *testing.T) { testRedisRestartMidRun(t, name, outage) })
	}
}

func testRedisRestartMidRun(t *testing.T, name string, outage bool) {
	s := redistest.StartServerWith(t, "--appendonly", "yes", "--appendfsync", "always")
	ctx := context.Background()
	g := newGate()
	var lost atomic.Int32
	pulling := HandlerFunc(func(ctx context.Context, run *Run) error {
		err := g.RunStage(ctx, run)
		if errors.Is(err, leasing.ErrLost) {
			lost.Add(1)
		}
		return err
	})
	var push counter
	e := newEnv(t, s.Client(t), Config{Prefix: "rec-restart-" + name, Jobs: []Job{{
		Scope: "course_sync", Retry: RetryPolicy{MaxAttempts: 5, Backoff: 10 * time.Millisecond, MaxBackoff: 50 * time.Millisecond},
		Stages: []Stage{{Name: "pulling", Handler: pulling}, {Name: "pushing", Handler: &push}},
	}}})
	const perRunner, runners, keys = 2, 2, 8
	const running = perRunner * runners
	for i := range runners {
		e.startRunner(RunnerConfig{ID: fmt.Sprintf("rec-%d", i), Concurrency: perRunner, LeaseTTL: 2 * time.Second})
	}
	subjects := make([]string, keys)
	for i := range subjects {
		subjects[i] = fmt.Sprintf("u%d", i)
		recSubmit(t, e, subjects[i], "course_sync", OutcomeStarted)
	}
	// Every slot is taken by a gated run; the rest stay queued.
	waitFor(t, 10*time.Second, "all slots in stage pulling", func() bool { return g.count() == running })
	count := func() map[Status]int {
		n := map[Status]int{}
		for _, sub := range subjects {
			v, err := e.reg.Get(ctx, sub, "course_sync")
			if err != nil {
				t.Fatalf("%s: %v", sub, err)
			}
			n[v.Status]++
		}
		return n
	}
	if n := count(); n[StatusRunning] != running || n[StatusQueued] != keys-running {
		t.Fatalf("before the crash: %v; want %d running, %d queued", n, running, keys-running)
	}

	s.Kill()
	if outage {
		// Holders give up 2/3 TTL after their last confirmed renewal.
		waitFor(t, 10*time.Second, "every holder stopped on lease loss", func() bool { return lost.Load() == running })
	}
	s.Restart(t)
	waitFor(t, 10*time.Second, "redis answers after restart", func() bool { return e.rdb.Ping(ctx).Err() == nil })
	// The records survived the crash and nothing could finish meanwhile
	// (after an outage, queued runs may already have taken the freed slots).
	if n := count(); n[StatusRunning]+n[StatusQueued] != keys {
		t.Fatalf("after the restart: %v; want all %d runs still running or queued", n, keys)
	}

	g.open()
	recovered := 0
	for _, sub := range subjects {
		v := e.waitStatus(sub, "course_sync", 20*time.Second, StatusDone, StatusFailed, StatusCancelled)
		ev := recHistory(t, e, sub, "course_sync")
		if v.Status != StatusDone {
			t.Errorf("%s: status %s (lastError %q), want done; history: %s", sub, v.Status, v.LastError, recEventNames(ev))
			continue
		}
		if push.get(sub+"/pushing") < 1 {
			t.Errorf("%s: done without running stage pushing", sub)
		}
		if len(recEvents(ev, "done")) != 1 {
			t.Errorf("%s: history %s; want exactly one done", sub, recEventNames(ev))
		}
		if len(recEvents(ev, "recovered")) > 0 {
			recovered++
		}
	}
	t.Logf("%d of %d runs recovered after their holder lost the lease", recovered, keys)
	if outage && recovered != running {
		t.Errorf("%d runs recovered, want the %d whose holders lost their leases", recovered, running)
	}
}

// TestRecoveryRedisRestartEmptyRecreatesGroups: a Redis that comes back
// empty (no persistence) loses its streams and consumer groups. Runs in
// flight are gone with their records, and their holders stop on lease loss
// without writing; the runners recreate the groups (NOGROUP) and execute
// new requests. Not on miniredis, which cannot crash; on a Cluster every
// master of the test's partitions crashes and comes back empty, on a
// cluster of the test's own (the shared one must not lose data).
func TestRecoveryRedisRestartEmptyRecreatesGroups(t *testing.T) {
	t.Run("redis", func(t *testing.T) {
		s := redistest.StartServer(t)
		testRedisRestartEmpty(t, s.Client(t), func(e *testEnv) {
			s.Kill()
			s.Restart(t)
			waitFor(t, 10*time.Second, "redis answers after restart", func() bool { return e.rdb.Ping(context.Background()).Err() == nil })
		})
	})
	t.Run("cluster", func(t *testing.T) {
		c := redistest.StartCluster(t)
		testRedisRestartEmpty(t, c.Client(t), func(e *testEnv) {
			ctx := context.Background()
			var masters []*redistest.Server
			for p := range e.reg.ks.Partitions() {
				if m := c.MasterOf(t, e.reg.ks.Tag(p)); !slices.Contains(masters, m) {
					masters = append(masters, m)
				}
			}
			for _, m := range masters {
				m.Kill()
			}
			for _, m := range masters {
				m.Restart(t) // same port, and its nodes.conf: it rejoins with its slots
			}
			t.Logf("%d of 3 masters restarted empty", len(masters))
			waitFor(t, 20*time.Second, "the cluster to serve every partition after the restart", func() bool {
				for p := range e.reg.ks.Partitions() {
					node, err := e.rdb.(*redis.ClusterClient).MasterForKey(ctx, e.reg.ks.Tag(p))
					if err != nil {
						return false
					}
					info, err := node.ClusterInfo(ctx).Result()
					if err != nil || !strings.Contains(info, "cluster_state:ok") {
						return false
					}
					if err := e.rdb.Exists(ctx, e.reg.ks.Index(p)).Err(); err != nil {
						return false
					}
				}
				return true
			})
		})
	})
}

// testRedisRestartEmpty runs TestRecoveryRedisRestartEmptyRecreatesGroups
// on rdb; restart crashes its Redis, brings it back empty and waits until
// it answers.
func testRedisRestartEmpty(t *testing.T, rdb redis.UniversalClient, restart func(e *testEnv)) {
	ctx := context.Background()
	g := newGate()
	var lost atomic.Int32
	pulling := HandlerFunc(func(ctx context.Context, run *Run) error {
		err := g.RunStage(ctx, run)
		if errors.Is(err, leasing.ErrLost) {
			lost.Add(1)
		}
		return err
	})
	var push counter
	e := newEnv(t, rdb, Config{Prefix: "rec-restart-empty", Jobs: []Job{{
		Scope: "course_sync", Retry: recRetry,
		Stages: []Stage{{Name: "pulling", Handler: pulling}, {Name: "pushing", Handler: &push}},
	}}})
	e.startRunner(RunnerConfig{ID: "rec-a", LeaseTTL: 2 * time.Second})
	subjects := []string{"u0", "u1", "u2", "u3", "u4", "u5", "u6", "u7"}
	for _, sub := range subjects[:4] {
		recSubmit(t, e, sub, "course_sync", OutcomeStarted)
	}
	waitFor(t, 10*time.Second, "runs in stage pulling", func() bool { return g.count() == 4 })

	restart(e)
	// Empty: the runs in flight are gone (the runners may already have
	// recreated streams and groups).
	for _, sub := range subjects[:4] {
		if _, err := e.reg.Get(ctx, sub, "course_sync"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("%s after an empty restart: %v, want ErrNotFound", sub, err)
		}
	}
	// The first renewal after the restart finds no lease.
	waitFor(t, 10*time.Second, "holders stopped on lease loss", func() bool { return lost.Load() == 4 })
	g.open()
	for _, sub := range subjects {
		recSubmit(t, e, sub, "course_sync", OutcomeStarted)
	}
	for _, sub := range subjects {
		v := e.waitStatus(sub, "course_sync", 20*time.Second, StatusDone, StatusFailed, StatusCancelled)
		if v.Status != StatusDone || v.Attempt != 1 {
			t.Errorf("%s: status %s attempt %d (lastError %q), want done on attempt 1", sub, v.Status, v.Attempt, v.LastError)
		}
		if n := push.get(sub + "/pushing"); n != 1 {
			t.Errorf("%s: stage pushing ran %d times, want 1", sub, n)
		}
	}
}

// TestRecoveryLeaseLossStopsStage: when the heartbeat finds the lease
// expired (Redis time moved past the TTL), the stage context is cancelled
// with a cause wrapping leasing.ErrLost and the runner writes nothing; the
// record stays running until another runner recovers it.
func TestRecoveryLeaseLossStopsStage(t *testing.T) {
	for _, b := range redistest.Backends(t, redistest.WithSharedCluster) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			var pull counter
			var push seenLog
			pushing := recHoldOnA(&push)
			e := newEnv(t, b.Client, Config{Prefix: "rec-lease-loss", Jobs: []Job{{
				Scope: "course_sync", Retry: recRetry,
				Stages: []Stage{{Name: "pulling", Handler: &pull}, {Name: "pushing", Handler: pushing}},
			}}})
			const ttl = 900 * time.Millisecond // renewals every 300ms
			// A never reclaims, so nobody but the test's runner B recovers the run.
			a, _ := e.startRunner(RunnerConfig{ID: "rec-a", LeaseTTL: ttl, ReclaimInterval: time.Hour})
			recSubmit(t, e, "u1", "course_sync", OutcomeStarted)
			waitFor(t, 10*time.Second, "runner A in stage pushing", func() bool { return len(push.get()) == 1 })

			k := taskkey.MustNew("u1", "course_sync")
			ks := e.reg.ks
			recBefore, err := e.rdb.HGetAll(ctx, ks.Task(k)).Result()
			if err != nil {
				t.Fatal(err)
			}
			histBefore := recHistory(t, e, "u1", "course_sync")

			if b.Real {
				// Real Redis time cannot jump past the TTL, and A's
				// renewals would keep the lease anyway: end the lease in
				// Redis time instead. A deadline in the past expires the
				// key at once, as its TTL running out would; nothing else
				// changes.
				if err := e.rdb.PExpireAt(ctx, ks.Lease(k), time.UnixMilli(1)).Err(); err != nil {
					t.Fatal(err)
				}
			} else {
				b.Advance(2 * ttl) // the lease expires by Redis time; nothing is deleted
			}
			waitFor(t, 5*time.Second, "runner A's stage context cancelled", func() bool { return len(push.get()) == 2 })
			cause := push.get()[1].cause
			if !errors.Is(cause, leasing.ErrLost) || !errors.Is(cause, leasing.ErrNotHeld) {
				t.Fatalf("stage context cause %v; want leasing.ErrLost from a refused renewal (ErrNotHeld)", cause)
			}
			waitFor(t, 5*time.Second, "runner A done with the run", func() bool {
				a.mu.Lock()
				defer a.mu.Unlock()
				return len(a.active) == 0
			})
			recAfter, err := e.rdb.HGetAll(ctx, ks.Task(k)).Result()
			if err != nil {
				t.Fatal(err)
			}
			for f, want := range recBefore {
				if recAfter[f] != want {
					t.Errorf("record field %s changed after the lease was lost: %q -> %q", f, want, recAfter[f])
				}
			}
			if recAfter["status"] != string(StatusRunning) {
				t.Errorf("status %q after the lease loss, want running (only a new holder may change it)", recAfter["status"])
			}
			if h := recHistory(t, e, "u1", "course_sync"); len(h) != len(histBefore) {
				t.Errorf("history grew after the lease loss: %s -> %s", recEventNames(histBefore), recEventNames(h))
			}
			if n, _ := e.rdb.Exists(ctx, ks.Lease(k)).Result(); n != 0 {
				t.Errorf("lease key still exists after expiry")
			}

			// Runner B reclaims the abandoned entry and resumes at stage pushing.
			e.startRunner(RunnerConfig{ID: "rec-b", LeaseTTL: ttl})
			v := e.waitStatus("u1", "course_sync", 10*time.Second, StatusDone, StatusFailed)
			if v.Status != StatusDone {
				t.Fatalf("status %s after recovery, want done", v.Status)
			}
			if n := pull.get("u1/pulling"); n != 1 {
				t.Errorf("stage pulling ran %d times, want 1", n)
			}
			seen := push.get()
			if len(seen) != 3 || !strings.HasPrefix(seen[2].owner, "rec-b/") || !seen[2].resumed || seen[2].token <= seen[0].token {
				t.Errorf("stage pushing executions %+v; want A then B (resumed, newer token)", seen)
			}
			ev := recHistory(t, e, "u1", "course_sync")
			lost, rec := recEvents(ev, "lease-lost"), recEvents(ev, "recovered")
			if len(lost) != 1 || !strings.HasPrefix(lost[0].Owner, "rec-a/") {
				t.Errorf("lease-lost events %+v, want one naming runner A: %s", lost, recEventNames(ev))
			}
			if len(rec) != 1 || rec[0].Outcome != "resume" || !strings.HasPrefix(rec[0].Owner, "rec-b/") {
				t.Errorf("recovered events %+v, want one resume by runner B: %s", rec, recEventNames(ev))
			}
		})
	}
}

// recHoldOnA is a stage that runner rec-a never finishes by itself (it
// returns only when its context ends) and any other runner completes; push
// logs every entry and rec-a's end.
func recHoldOnA(push *seenLog) HandlerFunc {
	return HandlerFunc(func(ctx context.Context, run *Run) error {
		st := seeRun(run)
		if strings.HasPrefix(run.Owner(), "rec-a/") {
			push.add(st)
			<-ctx.Done()
			st.cause = context.Cause(ctx)
			push.add(st)
			return st.cause
		}
		push.add(st)
		return nil
	})
}

// A finish after the run's lease expired is refused even when nobody has
// taken the run over yet (the record still carries the attempt's token):
// the run is recovered as after a crash, and its first attempt never
// records a result.
func TestFinishAfterTheLeaseExpiredIsRefused(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			var calls atomic.Int32
			var e *testEnv
			stage := HandlerFunc(func(ctx context.Context, run *Run) error {
				if calls.Add(1) == 1 {
					// The lease expires while the stage runs (an expired key is
					// an absent one).
					k, _, _ := e.reg.key(run.Subject(), "course_sync")
					if err := e.rdb.Del(ctx, e.reg.ks.Lease(k)).Err(); err != nil {
						return err
					}
				}
				return nil
			})
			e = newEnv(t, b.Client, Config{Prefix: "fexp", Jobs: []Job{clJob("course_sync", Stage{Name: "only", Handler: stage})}})
			e.startRunner(RunnerConfig{ID: "fexp", LeaseTTL: 300 * time.Millisecond})
			clSubmit(t, e.reg, "u1", "course_sync", SourceManual, "")
			var v TaskView
			waitFor(t, 10*time.Second, "the run done", func() bool {
				v, _ = e.reg.Get(context.Background(), "u1", "course_sync")
				if v.Status == StatusDone {
					return true
				}
				if calls.Load() > 0 {
					b.Advance(100 * time.Millisecond) // until the taken entry is reclaimable
				}
				return false
			})
			if v.Attempt != 2 || calls.Load() != 2 {
				t.Fatalf("done at attempt %d after %d stage calls, want the expired attempt refused and a second attempt", v.Attempt, calls.Load())
			}
		})
	}
}
