// Command bench measures tasklease side by side with asynq (v0.26.0) on
// one private redis-server, in the same run, on the same machine:
//
//	cd bench && go run .                 # full sizes, 3 repetitions, markdown table
//	cd bench && go run . --json          # one JSON object on stdout
//	cd bench && go run . --quick         # every size ~20x smaller: a smoke test, < 1 minute
//	cd bench && go run . --only e2e_1stage,pickup --reps 1
//
// It starts its own redis-server on a free loopback port (redis-server
// must be on PATH), empties it (FLUSHALL, CONFIG RESETSTAT) before every
// measurement, and runs each measurement for tasklease and then asynq,
// repetition after repetition (tl, asynq, tl, asynq, …). It reports the
// median of the repetitions and the per-repetition ratios tasklease ÷
// asynq (for rates, higher is better for tasklease). 50 client goroutines,
// runner/server concurrency 50, tasklease's default 16 partitions, one
// Registry and one Runner (or one asynq Client and Server) in this process,
// go-redis clients with 128 connections.
//
// Measurements (default sizes; --quick divides them by ~20):
//
//   - submit_hot: 200,000 requests for 1,000 keys (sources schedule,
//     foreground, manual; policy join), nothing consuming. tasklease joins
//     the queued runs; asynq enqueues with Unique(24h) and answers
//     ErrDuplicateTask. Checked: exactly 1,000 runs / pending tasks.
//   - submit_new: 100,000 requests for new keys (asynq with Unique).
//   - e2e_1stage, e2e_2stage: 20,000 distinct no-op runs (1 or 2 stages;
//     asynq always one task) submitted by 50 goroutines to an idle runner;
//     time until all are recorded done in Redis. During e2e the Redis CPU
//     (INFO cpu) and command (INFO commandstats) deltas and the client round
//     trips (a go-redis hook: one per command, one per pipeline, blocking
//     reads included) are taken per run. After e2e_1stage, bytes per
//     finished key: MEMORY USAGE SAMPLES 0 over every key ÷ runs (asynq
//     tasks with Retention(7d), as tasklease keeps finished records 7 days).
//   - pickup: 200 sequential samples on an idle runner, Submit → handler
//     start; asynq with its default TaskCheckInterval (1s) and with 10ms.
//   - fanout: one cron occurrence over 1,000,000 "subjects: all", fired by
//     a triggers.Scheduler in a child process (this binary re-executed), so
//     its peak RSS (VmHWM) is the leader's. Checked: one request per
//     subject. tasklease only.
//   - backlog: 100,000 queued schedule runs, then the runner starts and 100
//     manual requests for other keys arrive 5–10 ms apart; their Submit →
//     handler-start p99. asynq: the backlog in "default", the manual tasks
//     in "critical", StrictPriority.
//
// Limiters (tasklease only: asynq has no limiter, so these rows have no
// asynq column and no ratio to it):
//
//   - e2e_1stage_limited: e2e_1stage (the same runs, submitters and runner
//     of concurrency 50) with the job holding a named limiter of
//     concurrency 50, the runner's own, so the limit never binds: runs/s,
//     Redis commands and client round trips per run. Each repetition also
//     measures tasklease's plain e2e_1stage (alternately before and after)
//     and the goal is the ratio of the two within the repetition.
//     Checked: every run held exactly one slot of the limiter.
//   - limiter_fairness_p99_ms: a job with its own limiter of concurrency
//     10 and fair share by subject prefix, a ~5 ms stage (a sleep); tenant
//     A's 100,000 schedule runs (SubmitMany) wait in the limiter (its
//     waiting runs plus those started make the backlog), then tenant B's
//     100 runs, from the same source, arrive 5–10 ms apart: their Submit →
//     handler-start p50/p99. Fails if A's backlog ran dry first.
//   - rate_accuracy: a named limiter of rate 500/s, burst 10, saturated
//     for 10 s by a larger backlog of no-op runs: the handler starts
//     within 10 s from the first, less the burst, ÷ 500 × 10 (the goal
//     compared to 2 decimals). Also the most handler starts in any second.
//
// Fleets:
//
//   - idle: N idle pods (N = 1, 10, 100; tasklease Runners with 16
//     partitions, asynq Servers with their defaults), each on a go-redis
//     client of its own, nothing submitted: Redis commands per second per
//     pod (script commands included), Redis CPU as % of a core, and
//     connections per pod, over a 10 s window after they settle.
//   - fleet: 100 pods (Runners with clients of their own, lease TTL 5 s):
//     pick-up p50/p99 (as pickup, pods of concurrency 2); e2e_1stage with
//     100 pods of concurrency 1 ÷ one Runner of concurrency 100, in the
//     same repetition; takeover: 100 runs hold their stage on pods of
//     concurrency 2, 10 pods holding runs are killed at once (connections
//     cut, nothing released), seconds until the last of their runs starts
//     again on another pod. tasklease only.
//   - load: pick-up p50/p99 under open-loop Poisson arrivals at 50 % and
//     90 % of the system's saturation throughput (measured first in the
//     same repetition, as e2e_1stage), each run counted from its scheduled
//     arrival; asynq polling every 10 ms beside it.
//
// BullMQ (the second peer; skipped without node and `npm ci --prefix
// bench/bullmq`):
//
//   - bullmq: BullMQ 5.81.5 as a child process (bullmq/peer.mjs) on the
//     same Redis, beside tasklease in the same repetition: hot-key submits
//     (deduplication.id), end to end against E2ERuns pre-loaded jobs at
//     concurrency 50 with its default retention and with removeOnComplete
//     (the worker's start to the last completion), bytes per finished job,
//     idle pick-up, and 1/10/100 idle workers' load.
//
// Targets are evaluated and printed; the exit status is 0 whether or not
// they are met, 1 when a count check or a measurement failed, 2 when the
// bench could not start (bad flags, no redis-server).
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// Fixed parameters of every measurement.
const (
	clients     = 50 // submitting goroutines
	concurrency = 50 // tasklease Runner / asynq Server concurrency
	scope       = "sync"
	taskType    = "sync" // asynq task type
)

// sizes of the workloads.
type sizes struct {
	HotKeys        int `json:"hot_keys"`
	HotRequests    int `json:"hot_requests"`
	NewRequests    int `json:"new_requests"`
	E2ERuns        int `json:"e2e_runs"`
	PickupSamples  int `json:"pickup_samples"`
	FanoutSubjects int `json:"fanout_subjects"`
	Backlog        int `json:"backlog"`
	BacklogManual  int `json:"backlog_manual"`
	FairBacklog    int `json:"fair_backlog"`  // tenant A's runs waiting for the limiter
	FairRequests   int `json:"fair_requests"` // tenant B's runs
	RateSeconds    int `json:"rate_seconds"`  // how long the rate limiter is saturated
}

var fullSizes = sizes{
	HotKeys: 1_000, HotRequests: 200_000, NewRequests: 100_000, E2ERuns: 20_000,
	PickupSamples: 200, FanoutSubjects: 1_000_000, Backlog: 100_000, BacklogManual: 100,
	FairBacklog: 100_000, FairRequests: 100, RateSeconds: 10,
}

var quickSizes = sizes{
	HotKeys: 50, HotRequests: 10_000, NewRequests: 5_000, E2ERuns: 1_000,
	PickupSamples: 10, FanoutSubjects: 50_000, Backlog: 25_000, BacklogManual: 20,
	FairBacklog: 5_000, FairRequests: 20, RateSeconds: 2,
}

// measure is one family of measurements; run measures both systems once
// (one repetition).
type measure struct {
	name string
	run  func(b *bench, rep int) error
}

var measures = []measure{
	{"submit_hot", (*bench).submitHot},
	{"submit_new", (*bench).submitNew},
	{"e2e_1stage", func(b *bench, rep int) error { return b.e2e(rep, 1) }},
	{"e2e_2stage", func(b *bench, rep int) error { return b.e2e(rep, 2) }},
	{"pickup", (*bench).pickup},
	{"fanout", (*bench).fanout},
	{"backlog", (*bench).backlog},
	{"e2e_1stage_limited", (*bench).e2eLimited},
	{"limiter_fairness_p99_ms", (*bench).limiterFairness},
	{"rate_accuracy", (*bench).rateAccuracy},
	{"idle", (*bench).idle},
	{"fleet", (*bench).fleet},
	{"load", (*bench).load},
	{"bullmq", (*bench).bullmq},
}

// bench is the state shared by the measurements of one run.
type bench struct {
	ctx   context.Context
	addr  string // the private redis-server
	srv   *redisServer
	admin *redis.Client // FLUSHALL, INFO, checks: never counted
	sz    sizes
	rep   *report
	log   io.Writer // progress lines (stderr)
	// commands: print each end-to-end window's Redis commands per run
	// (--commands), to see where a system's Redis time goes.
	commands bool
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == fanoutChildFlag {
		return fanoutChild(args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	jsonOut := fs.Bool("json", false, "print one JSON object instead of the markdown table")
	reps := fs.Int("reps", 3, "repetitions of every measurement (tasklease and asynq alternate)")
	quick := fs.Bool("quick", false, "shrink every size ~20x (smoke test, under a minute)")
	only := fs.String("only", "", "comma-separated measurements to run: "+measureNames())
	jsonFile := fs.String("json-out", "", "also write the JSON object to this file")
	callgrind := fs.Bool("callgrind", false, "run Redis under valgrind's callgrind and report the instructions it executes per run/request (deterministic; rates are meaningless then, use with --quick)")
	commands := fs.Bool("commands", false, "print the Redis commands per run of every end-to-end window (INFO commandstats: calls and µs per run, by command; tasklease: FCALLs per run by function)")
	cpuProfile := fs.String("cpuprofile", "", "write a CPU profile of the bench process (both systems' clients and servers) to this file")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: go run . [--json] [--json-out FILE] [--reps N] [--quick] [--only name,name] [--cpuprofile FILE] [--callgrind] [--commands]\n\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *reps < 1 {
		fmt.Fprintln(stderr, "bench: --reps must be at least 1")
		return 2
	}
	selected, err := selectMeasures(*only)
	if err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	srv, err := startRedis(*callgrind)
	if err != nil {
		fmt.Fprintln(stderr, "bench: cannot start the private Redis:", err)
		return 2
	}
	defer srv.stop()
	admin := redis.NewClient(&redis.Options{Addr: srv.addr, PoolSize: 16, DisableIdentity: true, ClientName: "bench-admin"})
	defer admin.Close()

	b := &bench{ctx: ctx, addr: srv.addr, srv: srv, admin: admin, sz: fullSizes, log: stderr, commands: *commands}
	if *quick {
		b.sz = quickSizes
	}
	b.rep = newReport(*reps, *quick, b.sz)
	if b.rep.machine, err = machineInfo(ctx, admin); err != nil {
		fmt.Fprintln(stderr, "bench:", err)
		return 2
	}
	fmt.Fprintf(stderr, "bench: redis %s on %s, %d repetition(s), %s sizes\n",
		b.rep.machine.RedisVersion, srv.addr, *reps, map[bool]string{true: "quick", false: "full"}[*quick])

	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err == nil {
			err = pprof.StartCPUProfile(f)
		}
		if err != nil {
			fmt.Fprintln(stderr, "bench: cpu profile:", err)
			return 2
		}
		defer f.Close()
		defer pprof.StopCPUProfile()
	}
	started := time.Now()
	for _, m := range selected {
		b.rep.ran = append(b.rep.ran, m.name)
		t0 := time.Now()
		for rep := 1; rep <= *reps && ctx.Err() == nil; rep++ {
			if err := m.run(b, rep); err != nil {
				b.fail("%s rep %d: %v", m.name, rep, err)
			}
		}
		fmt.Fprintf(stderr, "bench: %s took %s\n", m.name, time.Since(t0).Round(100*time.Millisecond))
	}
	if ctx.Err() != nil {
		b.fail("interrupted")
	}
	b.rep.elapsed = time.Since(started)

	if *jsonOut {
		if err := b.rep.writeJSON(stdout); err != nil {
			fmt.Fprintln(stderr, "bench:", err)
			return 1
		}
	} else {
		b.rep.writeTable(stdout)
	}
	if *jsonFile != "" {
		if err := writeJSONFile(b.rep, *jsonFile); err != nil {
			fmt.Fprintln(stderr, "bench:", err)
			return 1
		}
	}
	if len(b.rep.errors) > 0 {
		fmt.Fprintf(stderr, "\nbench: %d CHECK(S) FAILED:\n", len(b.rep.errors))
		for _, e := range b.rep.errors {
			fmt.Fprintln(stderr, "  FAILED:", e)
		}
		return 1
	}
	return 0
}

func writeJSONFile(r *report, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := r.writeJSON(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func measureNames() string {
	names := make([]string, len(measures))
	for i, m := range measures {
		names[i] = m.name
	}
	return strings.Join(names, ",")
}

func selectMeasures(only string) ([]measure, error) {
	if only == "" {
		return measures, nil
	}
	var out []measure
	for _, name := range strings.Split(only, ",") {
		name = strings.TrimSpace(name)
		i := slices.IndexFunc(measures, func(m measure) bool { return m.name == name })
		if i < 0 {
			return nil, fmt.Errorf("unknown measurement %q (want some of %s)", name, measureNames())
		}
		if !slices.ContainsFunc(out, func(m measure) bool { return m.name == name }) {
			out = append(out, measures[i])
		}
	}
	return out, nil
}

// fail records a failed check or measurement: printed at once and again at
// the end, and the exit status becomes 1.
func (b *bench) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	fmt.Fprintln(b.log, "bench: FAILED:", msg)
	b.rep.errors = append(b.rep.errors, msg)
}

// check records a failed count check unless got == want.
func (b *bench) check(what string, got, want int64) {
	if got != want {
		b.fail("%s: got %d, want %d", what, got, want)
	}
}

// progress prints one line about a finished measurement.
func (b *bench) progress(format string, args ...any) {
	fmt.Fprintf(b.log, "  "+format+"\n", args...)
}

// reset empties Redis and its statistics before a measurement.
func (b *bench) reset() error { return resetServer(b.ctx, b.admin) }

// parallel calls fn(i) for every i in [0, n) from workers goroutines and
// returns the first error (the others stop taking work after it).
func parallel(ctx context.Context, n, workers int, fn func(i int) error) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	next := make(chan int, workers)
	go func() {
		defer close(next)
		for i := range n {
			select {
			case next <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
	done := make(chan struct{})
	for range workers {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range next {
				if err := fn(i); err != nil {
					cancel(err)
					return
				}
			}
		}()
	}
	for range workers {
		<-done
	}
	return context.Cause(ctx) // nil unless fn failed or the parent ended
}

// waitUntil polls cond every step until it is true, ctx ends or timeout
// passes.
func waitUntil(ctx context.Context, timeout, step time.Duration, cond func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	for {
		ok, err := cond()
		if err != nil || ok {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not reached within %s", timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(step):
		}
	}
}
