package jobs

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/anishathalye/porcupine"
	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/histories"
	"github.com/tasklease/tasklease/internal/redistest"
)

// Every key's history, as the runners saw it — grants with their tokens,
// stage advances, finishes, and the writes whose reply never came — is
// linearizable against one key's run (internal/histories), while runners
// are stopped without a grace, stages outlive their lease (a holder frozen
// past its TTL, then writing) and requests and cancels arrive at random.
// TASKLEASE_HISTORIES=30s runs it longer.
// Not parallel, and short: under -race its runners load the machine that
// other packages' timing tests share.
func TestHistoriesLinearizable(t *testing.T) {
	dur := 3 * time.Second
	if v := os.Getenv("TASKLEASE_HISTORIES"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatal(err)
		}
		dur = d
	}
	srv := redistest.StartServer(t)
	rec := histories.NewRecorder()
	var frozen atomic.Int64
	stage := func(ctx context.Context, run *Run) error {
		if rand.IntN(20) == 0 { // outlive the lease: the next write is refused
			frozen.Add(1)
			time.Sleep(1500 * time.Millisecond)
			return nil
		}
		select {
		case <-time.After(time.Duration(rand.IntN(20)) * time.Millisecond):
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	job := Job{Scope: "sync", Stages: []Stage{{Name: "pull", Handler: HandlerFunc(stage)}, {Name: "merge", Handler: HandlerFunc(stage)},
		{Name: "push", Handler: HandlerFunc(stage)}}}
	cfg := Config{Prefix: "hist", Partitions: 4, Jobs: []Job{job}}
	e := newEnv(t, srv.Client(t), cfg)
	start := func(i int) context.CancelFunc {
		reg, err := NewRegistry(srv.Client(t), Config{Prefix: "hist", Partitions: 4, Jobs: []Job{job}, Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		rn, err := NewRunner(reg, RunnerConfig{ID: fmt.Sprintf("h%d", i), Concurrency: 4, LeaseTTL: time.Second,
			ShutdownGrace: 0, FetchBlock: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		rn.testHooks.history = rec.Add
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { _ = rn.Run(ctx); close(done) }()
		return func() { cancel(); <-done }
	}
	stops := make([]context.CancelFunc, 3)
	for i := range stops {
		stops[i] = start(i)
	}
	ctx := context.Background()
	deadline := time.Now().Add(dur)
	restarts, cancels := 0, 0
	for n := 0; time.Now().Before(deadline); n++ {
		subject := fmt.Sprintf("u%d", rand.IntN(20))
		switch r := rand.IntN(100); {
		case r < 3:
			i := rand.IntN(len(stops))
			stops[i]()
			stops[i] = start(i + 10*restarts + 10)
			restarts++
		case r < 8:
			_, _ = e.reg.Cancel(ctx, subject, "sync")
			cancels++
		default:
			if _, err := e.reg.Submit(ctx, subject, "sync", SubmitOptions{Source: SourceManual}); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, s := range stops {
		s()
	}
	res, err := rec.Check(time.Minute, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s; %d runner restarts, %d cancels, %d stages frozen past their lease", res, restarts, cancels, frozen.Load())
	if res.Verdict != porcupine.Ok {
		t.Fatalf("not linearizable: %s", res)
	}
	if res.Ops < 20 { // a history at all: its size depends on the machine
		t.Fatalf("only %d operations recorded", res.Ops)
	}
}

// TestHistoryLog: a runner with RunnerConfig.HistoryLog writes what it saw
// of a run — its grant, each advance (sent, then answered) and its finish —
// and the log reads back as a linearizable history of that run.
func TestHistoryLog(t *testing.T) {
	mr := miniredis.RunT(t)
	noop := HandlerFunc(func(context.Context, *Run) error { return nil })
	e := newEnv(t, redis.NewClient(&redis.Options{Addr: mr.Addr()}), Config{Jobs: []Job{{Scope: "sync",
		Stages: []Stage{{Name: "pull", Handler: noop}, {Name: "merge", Handler: noop}, {Name: "push", Handler: noop}}}}})
	var buf syncBuffer
	_, stop := e.startRunner(RunnerConfig{ID: "h", Concurrency: 2, HistoryLog: &buf})
	if _, err := e.reg.Submit(context.Background(), "u1", "sync", SubmitOptions{Source: SourceManual}); err != nil {
		t.Fatal(err)
	}
	e.waitStatus("u1", "sync", 5*time.Second, StatusDone)
	stop()
	// a line per grant; two per advance and finish: sent, then answered
	if n := strings.Count(buf.String(), "\n"); n != 7 {
		t.Errorf("%d log lines, want 7:\n%s", n, buf.String())
	}
	entries, err := histories.ReadLog(strings.NewReader(buf.String()))
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, en := range entries {
		if en.Out != histories.OK || en.Op.Key != "u1|sync" || en.Ret < en.Call {
			t.Errorf("entry %+v: want an answered operation of u1|sync", en)
		}
		kinds = append(kinds, fmt.Sprintf("%s %d", en.Op.Kind, en.Op.Done))
	}
	// the finish completes the last stage (it saves the advance's round trip)
	if want := []string{"grant 0", "advance 1", "advance 2", "finish 3"}; !slices.Equal(kinds, want) {
		t.Fatalf("log has %v, want %v:\n%s", kinds, want, buf.String())
	}
	if !entries[3].Op.Ends {
		t.Error("the finish did not end the run")
	}
	res, err := histories.Check(histories.Operations(entries), time.Minute, "")
	if err != nil || res.Verdict != porcupine.Ok {
		t.Fatalf("%v, %v", res, err)
	}
}
