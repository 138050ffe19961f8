package jobs

// Benchmarks and the round-trip budget test against a real redis-server
// (internal/redistest); they skip when redis-server is not on PATH.
//
//	go test -run='^$' -bench='Submit|EndToEnd|Script' -benchtime=3s ./jobs/
//	go test -run=TestRoundTripsPerRun -v ./jobs/
//
// Every benchmark reports, next to ns/op, the Redis server time per op
// ("srv-us/op": the usec INFO commandstats charges to the top-level
// commands, nested script commands included), so a regression can be told
// apart as Go-side or Redis-side.

import (
	"context"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/benchutil"
	"github.com/tasklease/tasklease/internal/keyspace"
	"github.com/tasklease/tasklease/leasing"
	"github.com/tasklease/tasklease/lua"
)

const benchScope = "bench"

var noopStage = HandlerFunc(func(context.Context, *Run) error { return nil })

// benchRegistry returns a registry with one two-stage job (benchScope);
// last, when set, is the handler of the second stage.
func benchRegistry(tb testing.TB, rdb redis.UniversalClient, partitions int, last Handler) *Registry {
	tb.Helper()
	if last == nil {
		last = noopStage
	}
	reg, err := NewRegistry(rdb, Config{
		Partitions: partitions,
		Logger:     testLogger(tb),
		Jobs: []Job{{
			Scope:  benchScope,
			Stages: []Stage{{Name: "fetch", Handler: noopStage}, {Name: "store", Handler: last}},
		}},
	})
	if err != nil {
		tb.Fatal(err)
	}
	return reg
}

// startBenchRunner runs a Runner until stop (or the end of tb).
func startBenchRunner(tb testing.TB, reg *Registry, cfg RunnerConfig) (*Runner, func()) {
	tb.Helper()
	if cfg.ShutdownGrace == 0 {
		cfg.ShutdownGrace = 5 * time.Second
	}
	rn, err := NewRunner(reg, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- rn.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				tb.Errorf("runner: %v", err)
			}
		})
	}
	tb.Cleanup(stop)
	return rn, stop
}

// completions counts runs whose last stage ran and signals when a target
// is reached. Counting happens in Go, never by polling Redis.
type completions struct {
	n      atomic.Int64
	target atomic.Int64
	done   chan struct{} // buffered(1); receives once per target reached
}

func newCompletions() *completions { return &completions{done: make(chan struct{}, 1)} }

func (c *completions) RunStage(context.Context, *Run) error {
	if c.n.Add(1) == c.target.Load() {
		c.done <- struct{}{}
	}
	return nil
}

// expect resets the count and arms the signal for n more completions. Call
// it only while no run is executing.
func (c *completions) expect(n int) {
	c.n.Store(0)
	c.target.Store(int64(n))
}

func (c *completions) wait(tb testing.TB, d time.Duration) {
	tb.Helper()
	select {
	case <-c.done:
	case <-time.After(d):
		tb.Fatalf("timed out after %s: %d of %d runs completed", d, c.n.Load(), c.target.Load())
	}
}

// parallelism returns the SetParallelism factor that gives about n
// goroutines in RunParallel.
func parallelism(n int) int {
	p := runtime.GOMAXPROCS(0)
	return max(1, (n+p-1)/p)
}

// meter measures one timed section: the Redis time charged to the
// top-level commands (INFO commandstats, wall clock, nested script commands
// included) and the CPU time of both sides (this process and redis-server).
// CPU per op is what to compare on a shared machine: wall-clock figures
// grow with other load, CPU time does not.
type meter struct {
	rdb redis.UniversalClient
	cpu benchutil.CPU
	cg  *benchutil.Callgrind // nil unless redis-server runs under callgrind
}

// startMeter resets INFO commandstats and samples CPU (and zeroes
// callgrind's counters when srv runs under it). Call it right before
// b.ResetTimer.
func startMeter(tb testing.TB, srv *benchutil.Redis, rdb redis.UniversalClient) *meter {
	tb.Helper()
	ctx := context.Background()
	if err := benchutil.ResetStats(ctx, rdb); err != nil {
		tb.Fatal(err)
	}
	cpu, err := benchutil.TakeCPU(ctx, rdb)
	if err != nil {
		tb.Fatal(err)
	}
	cg, err := benchutil.StartCallgrind(ctx, rdb, srv.CallgrindDir)
	if err != nil {
		tb.Fatal(err)
	}
	return &meter{rdb: rdb, cpu: cpu, cg: cg}
}

// report adds srv-us/op (commandstats usec of the top-level commands in
// names per op), redis-cpu-us/op and go-cpu-us/op. Call it after
// b.StopTimer.
func (m *meter) report(b *testing.B, names ...string) {
	b.Helper()
	ctx := context.Background()
	cpu, err := benchutil.TakeCPU(ctx, m.rdb)
	if err != nil {
		b.Fatal(err)
	}
	d := cpu.Sub(m.cpu)
	st, err := benchutil.CommandStats(ctx, m.rdb)
	if err != nil {
		b.Fatal(err)
	}
	_, usec := benchutil.ServerUsec(st, names...)
	n := float64(b.N)
	b.ReportMetric(float64(usec)/n, "srv-us/op")
	b.ReportMetric(float64(d.Redis.Microseconds())/n, "redis-cpu-us/op")
	b.ReportMetric(float64(d.RedisSys.Microseconds())/n, "redis-sys-us/op")
	b.ReportMetric(float64(d.Go.Microseconds())/n, "go-cpu-us/op")
	if m.cg != nil {
		ir, err := m.cg.Instructions()
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(ir)/1000/n, "redis-kinstr/op")
	}
	if testing.Verbose() {
		b.Logf("N=%d INFO commandstats:\n%s", b.N, benchutil.FormatStats(st))
	}
}

func subjects(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = prefix + strconv.Itoa(i)
	}
	return out
}

// submitAll submits every subject from workers goroutines.
func submitAll(tb testing.TB, reg *Registry, subs []string, workers int) {
	tb.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Pointer[error]
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(subs) || failed.Load() != nil {
					return
				}
				if _, err := reg.Submit(context.Background(), subs[i], benchScope, SubmitOptions{Source: SourceSchedule}); err != nil {
					failed.Store(&err)
					return
				}
			}
		})
	}
	wg.Wait()
	if e := failed.Load(); e != nil {
		tb.Fatal(*e)
	}
}

// BenchmarkSubmitParallel: 50 clients submit to 1,000 keys of one scope.
// Every key is made active first and no runner runs, so every timed submit
// is a join — the registry's hot path when many triggers fire at once.
func BenchmarkSubmitParallel(b *testing.B) { benchSubmitParallel(b, false) }

// BenchmarkSubmitParallelAutoPipeline is BenchmarkSubmitParallel with the
// registry on go-redis's AutoPipeliner: concurrent commands share
// connections and syscalls (no engine change; the AutoPipeliner is a
// redis.UniversalClient).
func BenchmarkSubmitParallelAutoPipeline(b *testing.B) { benchSubmitParallel(b, true) }

// autoPipeline returns rdb's blocking-face AutoPipeliner.
func autoPipeline(tb testing.TB, rdb *redis.Client) redis.UniversalClient {
	tb.Helper()
	ap, err := rdb.AutoPipeline()
	if err != nil {
		tb.Fatal(err)
	}
	return ap
}

func benchSubmitParallel(b *testing.B, autopipe bool) {
	const clients, keys = 50, 1000
	srv := benchutil.Server(b)
	rdb := benchutil.Client(b, srv.Addr(), clients+14) // ≥ 60: one connection per client and spare
	var cl redis.UniversalClient = rdb
	if autopipe {
		cl = autoPipeline(b, rdb)
	}
	reg := benchRegistry(b, cl, keyspace.PartitionsDefault, nil)
	subs := subjects("u", keys)
	submitAll(b, reg, subs, clients) // every key active: the timed submits join
	ctx := context.Background()
	var next atomic.Uint64
	var joined atomic.Int64
	b.SetParallelism(parallelism(clients))
	b.ReportAllocs()
	m := startMeter(b, srv, rdb)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			s := subs[next.Add(1)%keys]
			res, err := reg.Submit(ctx, s, benchScope, SubmitOptions{Source: SourceSchedule})
			if err != nil {
				b.Error(err)
				return
			}
			if res.Outcome == OutcomeJoined {
				joined.Add(1)
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "submits/s")
	m.report(b, benchutil.ScriptCommands...)
	if j := joined.Load(); j != int64(b.N) {
		b.Errorf("%d of %d submits joined", j, b.N)
	}
}

// BenchmarkEndToEndRuns: one Runner (concurrency 50, 16 partitions) runs a
// two-stage job with no-op stages; 50 clients submit distinct keys. One op
// is one run submitted and completed (its last stage ran: the count is kept
// in the handler, in Go).
func BenchmarkEndToEndRuns(b *testing.B) { benchEndToEnd(b, false) }

// BenchmarkEndToEndRunsAutoPipeline is BenchmarkEndToEndRuns with both
// registries on go-redis's AutoPipeliner (blocking stream reads are diverted
// to ordinary pooled connections by go-redis).
func BenchmarkEndToEndRunsAutoPipeline(b *testing.B) { benchEndToEnd(b, true) }

func benchEndToEnd(b *testing.B, autopipe bool) {
	const conc, parts, clients = 50, 16, 50
	srv := benchutil.Server(b)
	runnerRdb := benchutil.Client(b, srv.Addr(), conc+parts+16) // ≥ Concurrency + partitions + 10
	submitRdb := benchutil.Client(b, srv.Addr(), clients+14)
	var runnerCl, submitCl redis.UniversalClient = runnerRdb, submitRdb
	if autopipe {
		runnerCl, submitCl = autoPipeline(b, runnerRdb), autoPipeline(b, submitRdb)
	}
	comp := newCompletions()
	runnerReg := benchRegistry(b, runnerCl, parts, comp)
	submitReg := benchRegistry(b, submitCl, parts, nil)
	startBenchRunner(b, runnerReg, RunnerConfig{ID: "bench", Concurrency: conc})

	// Warm up: groups created, scripts loaded, pools dialled.
	const warm = 200
	comp.expect(warm)
	submitAll(b, submitReg, subjects("w", warm), clients)
	comp.wait(b, 30*time.Second)

	ctx := context.Background()
	comp.expect(b.N)
	subs := subjects("e", b.N)
	var next atomic.Int64
	b.SetParallelism(parallelism(clients))
	b.ReportAllocs()
	m := startMeter(b, srv, runnerRdb)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			s := subs[next.Add(1)-1]
			if _, err := submitReg.Submit(ctx, s, benchScope, SubmitOptions{Source: SourceSchedule}); err != nil {
				b.Error(err)
				return
			}
		}
	})
	comp.wait(b, time.Minute+time.Duration(b.N)*time.Millisecond)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "runs/s")
	m.report(b, slices.Concat(benchutil.ScriptCommands, []string{"xreadgroup", "xpending", "xclaim"})...)
}

// BenchmarkSubmitScript: one client, one submit at a time — the latency
// and Go/Redis cost of the submit script alone, per path.
func BenchmarkSubmitScript(b *testing.B) {
	b.Run("start", func(b *testing.B) {
		srv := benchutil.Server(b)
		rdb := benchutil.Client(b, srv.Addr(), 4)
		reg := benchRegistry(b, rdb, keyspace.PartitionsDefault, nil)
		subs := subjects("s", b.N)
		ctx := context.Background()
		reg.Submit(ctx, "warm", benchScope, SubmitOptions{}) // load the script
		b.ReportAllocs()
		m := startMeter(b, srv, rdb)
		b.ResetTimer()
		for i := range b.N {
			if _, err := reg.Submit(ctx, subs[i], benchScope, SubmitOptions{Source: SourceSchedule}); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		m.report(b, benchutil.ScriptCommands...)
	})
	b.Run("join", func(b *testing.B) {
		srv := benchutil.Server(b)
		rdb := benchutil.Client(b, srv.Addr(), 4)
		reg := benchRegistry(b, rdb, keyspace.PartitionsDefault, nil)
		subs := subjects("u", 1000)
		submitAll(b, reg, subs, 16)
		ctx := context.Background()
		b.ReportAllocs()
		m := startMeter(b, srv, rdb)
		b.ResetTimer()
		for i := range b.N {
			if _, err := reg.Submit(ctx, subs[i%len(subs)], benchScope, SubmitOptions{Source: SourceSchedule}); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		m.report(b, benchutil.ScriptCommands...)
	})
}

// claimed is one granted claim, ready to advance and finish.
type claimed struct {
	e     entry
	lease leasing.Lease
	c     claimResult
}

// pendingEntries submits n distinct keys and takes their entries into the
// taken set, as the fetch loop would.
func pendingEntries(b *testing.B, reg *Registry, rn *Runner, n int) []claimed {
	b.Helper()
	submitAll(b, reg, subjects("c", n), 32)
	out := make([]claimed, 0, n)
	for p := range reg.ks.Partitions() {
		for _, e := range takeEntries(b, reg, p, n) {
			out = append(out, claimed{e: e})
		}
	}
	if len(out) != n {
		b.Fatalf("read %d of %d entries", len(out), n)
	}
	return out
}

func claimAll(b *testing.B, rn *Runner, cs []claimed) {
	b.Helper()
	ctx := context.Background()
	ttl := rn.cfg.LeaseTTL
	for i := range cs {
		c := &cs[i]
		res, err := rn.claim(ctx, c.e.p, []entry{c.e})
		if err != nil {
			b.Fatal(err)
		}
		if res[0].kind != "granted" {
			b.Fatalf("claim %s: %s", c.e.key, res[0].kind)
		}
		c.c = res[0]
		c.lease = leasing.Lease{Key: c.e.key, Owner: rn.owner, Token: res[0].token, TTL: ttl, GrantedAt: time.Now()}
	}
}

func advanceAll(b *testing.B, reg *Registry, cs []claimed) {
	b.Helper()
	for i := range cs {
		if _, err := reg.store.Advance(context.Background(), cs[i].lease, cs[i].e.runID, "fetch"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkClaimScript, BenchmarkAdvanceScript, BenchmarkFinishScript: one
// client, the run hot path's three scripts one at a time (setup untimed).
func BenchmarkClaimScript(b *testing.B) {
	srv := benchutil.Server(b)
	rdb := benchutil.Client(b, srv.Addr(), 4)
	reg := benchRegistry(b, rdb, keyspace.PartitionsDefault, nil)
	rn, err := NewRunner(reg, RunnerConfig{ID: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	cs := pendingEntries(b, reg, rn, b.N+1)
	claimAll(b, rn, cs[:1]) // load the script
	cs = cs[1:]
	ctx := context.Background()
	b.ReportAllocs()
	m := startMeter(b, srv, rdb)
	b.ResetTimer()
	for i := range cs {
		c := &cs[i]
		res, err := rn.claim(ctx, c.e.p, []entry{c.e})
		if err != nil || res[0].kind != "granted" {
			b.Fatalf("claim %s: %v %v", c.e.key, res, err)
		}
	}
	b.StopTimer()
	m.report(b, benchutil.ScriptCommands...)
}

func BenchmarkAdvanceScript(b *testing.B) {
	srv := benchutil.Server(b)
	rdb := benchutil.Client(b, srv.Addr(), 4)
	reg := benchRegistry(b, rdb, keyspace.PartitionsDefault, nil)
	rn, err := NewRunner(reg, RunnerConfig{ID: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	cs := pendingEntries(b, reg, rn, b.N+1)
	claimAll(b, rn, cs)
	advanceAll(b, reg, cs[:1])
	cs = cs[1:]
	b.ReportAllocs()
	m := startMeter(b, srv, rdb)
	b.ResetTimer()
	advanceAll(b, reg, cs)
	b.StopTimer()
	m.report(b, benchutil.ScriptCommands...)
}

func BenchmarkFinishScript(b *testing.B) {
	srv := benchutil.Server(b)
	rdb := benchutil.Client(b, srv.Addr(), 4)
	reg := benchRegistry(b, rdb, keyspace.PartitionsDefault, nil)
	rn, err := NewRunner(reg, RunnerConfig{ID: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	job := reg.jobs[benchScope]
	cs := pendingEntries(b, reg, rn, b.N+1)
	claimAll(b, rn, cs)
	advanceAll(b, reg, cs)
	finish := func(c *claimed) {
		rn.finish(job, c.e, c.lease, resultDone, "store", nil, c.c.attempt, false, rn.log)
	}
	finish(&cs[0])
	cs = cs[1:]
	ctx := context.Background()
	b.ReportAllocs()
	m := startMeter(b, srv, rdb)
	b.ResetTimer()
	for i := range cs {
		finish(&cs[i])
	}
	b.StopTimer()
	m.report(b, benchutil.ScriptCommands...)
	st, _ := benchutil.CommandStats(ctx, rdb)
	if n := st["evalsha"].Calls + st["fcall"].Calls; n != int64(b.N) {
		b.Errorf("finish ran %d times, want %d", n, b.N)
	}
}

// BenchmarkPingParallel is the floor: a plain Redis round trip from 50
// clients, what no script can beat on this machine.
func BenchmarkPingParallel(b *testing.B) {
	srv := benchutil.Server(b)
	rdb := benchutil.Client(b, srv.Addr(), 64)
	ctx := context.Background()
	b.SetParallelism(parallelism(50))
	b.ReportAllocs()
	m := startMeter(b, srv, rdb)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := rdb.Ping(ctx).Err(); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "ops/s")
	m.report(b, "ping")
}

// roundTripBudget is the most Redis round trips one two-stage run may cost
// on the hot path: submit, stream read, claim, advance, finish, plus one
// spare for reads that come back empty.
const roundTripBudget = 6

// TestRoundTripsPerRun counts the Redis commands a two-stage run costs on
// the hot path, client side (a go-redis hook on the runner's and the
// submitter's clients), and cross-checks them with INFO commandstats.
// Background loops (retry mover, reclaimer) are slowed to an hour so they
// do not count. It is a count, not a timing, so it asserts the budget.
func TestRoundTripsPerRun(t *testing.T) {
	srv := benchutil.Server(t)
	ctx := context.Background()
	{
		probe := benchutil.Client(t, srv.Addr(), 2)
		delta, nestedSet, err := benchutil.VerifyNestedCounting(ctx, probe)
		if err != nil {
			t.Fatal(err)
		}
		// Redis 7: total_commands_processed and commandstats include the
		// commands scripts run, so neither counts round trips by itself.
		t.Logf("one EVAL running 3 commands: total_commands_processed +%d, cmdstat_set calls=%d "+
			"(script commands are counted server-side; round trips are counted with a client hook)", delta, nestedSet)
	}

	const n, conc, parts, clients = 2000, 50, 16, 50
	for _, mode := range []string{"streaming", "backlog"} {
		t.Run(mode, func(t *testing.T) {
			srv := benchutil.Server(t)
			runCtr, subCtr := benchutil.NewCounter(), benchutil.NewCounter()
			runnerRdb := benchutil.Client(t, srv.Addr(), conc+parts+16, runCtr)
			submitRdb := benchutil.Client(t, srv.Addr(), clients+14, subCtr)
			comp := newCompletions()
			runnerReg := benchRegistry(t, runnerRdb, parts, comp)
			submitReg := benchRegistry(t, submitRdb, parts, nil)
			cfg := RunnerConfig{ID: "rt", Concurrency: conc, RetryPoll: time.Hour, ReclaimInterval: time.Hour}

			var stop func()
			if mode == "streaming" {
				_, stop = startBenchRunner(t, runnerReg, cfg)
				comp.expect(20) // warm-up: scripts loaded, fetch loops blocking
				done := runCtr.WaitFor("script:finish", 20)
				submitAll(t, submitReg, subjects("w", 20), 4)
				comp.wait(t, 30*time.Second)
				<-done
				time.Sleep(50 * time.Millisecond) // let every fetch loop reach its blocking read
			} else {
				// Load the scripts without counting them, then queue everything.
				for _, s := range []*redis.Script{runnerReg.scripts.claim, runnerReg.scripts.finish, lua.MustScript("checkpoint_advance"), submitReg.scripts.submit} {
					if err := s.Load(ctx, runnerRdb).Err(); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err := benchutil.ResetStats(ctx, runnerRdb); err != nil {
				t.Fatal(err)
			}
			runCtr.Reset()
			subCtr.Reset()
			comp.expect(n)
			finished := runCtr.WaitFor("script:finish", n)
			start := time.Now()
			submitAll(t, submitReg, subjects("r", n), clients)
			if mode == "backlog" {
				_, stop = startBenchRunner(t, runnerReg, cfg)
			}
			comp.wait(t, time.Minute)
			select {
			case <-finished:
			case <-time.After(30 * time.Second):
				t.Fatal("finish scripts not all sent")
			}
			elapsed := time.Since(start)
			runCmds, runRT := runCtr.Snapshot()
			subCmds, subRT := subCtr.Snapshot()
			st, err := benchutil.CommandStats(ctx, runnerRdb)
			if err != nil {
				t.Fatal(err)
			}
			stop()

			all := map[string]int64{}
			for k, v := range runCmds {
				all["runner "+k] += v
			}
			for k, v := range subCmds {
				all["submit "+k] += v
			}
			// Connection setup (HELLO on each new pooled connection, consumer
			// group creation) is not per run: report it, keep it out of the budget.
			var setup int64
			for k, v := range all {
				if strings.HasSuffix(k, " hello") || strings.HasSuffix(k, " xgroup|create") ||
					strings.HasSuffix(k, " xgroup") || strings.HasSuffix(k, " client|setinfo") {
					setup += v
				}
			}
			perRun := float64(runRT+subRT-setup) / n
			t.Logf("%s: %d two-stage runs in %s (%.0f runs/s); round trips: runner %d + submit %d - setup %d = %.2f per run (budget %d)\n%s",
				mode, n, elapsed.Round(time.Millisecond), n/elapsed.Seconds(), runRT, subRT, setup, perRun, roundTripBudget,
				benchutil.FormatCounts(all, n))
			// Server-side cross-check: commands only clients send.
			clientOnly := []string{"evalsha", "eval", "fcall", "xreadgroup", "xpending", "xclaim", "xgroup|create", "subscribe", "ping"}
			var srvCalls int64
			for _, c := range clientOnly {
				srvCalls += st[c].Calls
			}
			t.Logf("server commandstats, client-only commands %v: %d calls (%.2f per run; blocking reads still "+
				"waiting are counted by the hook but not yet by the server)\n%s", clientOnly, srvCalls, float64(srvCalls)/n,
				benchutil.FormatStats(st))
			if perRun > roundTripBudget {
				t.Errorf("%.2f round trips per run on the hot path, budget %d", perRun, roundTripBudget)
			}
			if got := runCmds["script:heartbeat"]; got > 0 {
				t.Logf("note: %d heartbeats in the window", got)
			}
			for k, v := range all {
				if strings.Contains(k, " eval:") {
					t.Logf("note: %d NOSCRIPT fallbacks (%s) in the window", v, k)
				}
			}
		})
	}
}
