package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hibiken/asynq"

	"github.com/tasklease/tasklease/jobs"
)

// e2eTimeout bounds one end-to-end measurement.
const e2eTimeout = 10 * time.Minute

// e2eResult is one system's end-to-end figures, per run.
type e2eResult struct {
	rate        float64 // runs/s, first submit → all recorded done in Redis
	redisCPUus  float64 // Redis used_cpu_user+sys
	redisSysUs  float64 // of it, used_cpu_sys
	redisCalls  float64 // INFO commandstats calls (script commands included)
	redisInstr  float64 // instructions Redis executed (--callgrind only)
	roundTrips  float64 // client round trips of this system's client
	benchCPUus  float64 // CPU of this process (submitters + runner/server)
	bytesPerKey float64 // MEMORY USAGE of every key ÷ runs (e2e_1stage only)
	bytesByKind map[string]int64
	commands    map[string]cmdStat // per-command deltas over the window
	fcalls      map[string]int64   // FCALLs sent by function over the window (--commands, tasklease)
}

// e2e: N distinct no-op runs submitted by 50 goroutines to an idle runner
// (tasklease: a job of `stages` stages; asynq: always one task).
//
// An idle asynq server polls its empty queues every TaskCheckInterval
// (default 1s, with jitter up to 1.5s), so it starts on a burst up to 1.5s
// late: pickup latency (measured apart), not throughput, and at these sizes
// it would dominate asynq's rate. The ratios are therefore taken against
// an asynq server polling every 10ms, which only helps asynq; e2e_1stage
// also reports asynq with the default (asynq_default_e2e_1stage_per_s).
func (b *bench) e2e(rep, stages int) error {
	name := fmt.Sprintf("e2e_%dstage", stages)
	oneStage := stages == 1 // also: bytes per key, asynq with its default polling
	tl, err := b.e2eTasklease(name, rep, tlVariant{stages: stages, withBytes: oneStage})
	if err != nil {
		return fmt.Errorf("tasklease: %w", err)
	}
	as, err := b.e2eAsynq(name, rep, asynqFastCheck, oneStage)
	if err != nil {
		return fmt.Errorf("asynq: %w", err)
	}
	b.rep.add2(name+"_per_s", tl.rate, as.rate)
	if b.commands {
		b.progress("%s rep %d: tasklease per run: %s", name, rep, formatCommands(tl.commands, b.sz.E2ERuns))
		b.progress("%s rep %d: tasklease FCALLs per run: %s", name, rep, formatFcalls(tl.fcalls, b.sz.E2ERuns))
		b.progress("%s rep %d: asynq per run: %s", name, rep, formatCommands(as.commands, b.sz.E2ERuns))
	}
	b.progress("%s rep %d: tasklease %.0f runs/s (redis %.1f µs of which sys %.1f, %.1f calls, %.2f round trips per run), asynq %.0f runs/s (redis %.1f µs of which sys %.1f, %.1f calls, %.2f round trips per run)",
		name, rep, tl.rate, tl.redisCPUus, tl.redisSysUs, tl.redisCalls, tl.roundTrips, as.rate, as.redisCPUus, as.redisSysUs, as.redisCalls, as.roundTrips)
	if !oneStage {
		b.rep.add2(name+"_redis_cpu_us_per_run", tl.redisCPUus, as.redisCPUus)
		b.rep.add2(name+"_redis_calls_per_run", tl.redisCalls, as.redisCalls)
		b.rep.add2("round_trips_per_2stage_run", tl.roundTrips, as.roundTrips)
		b.rep.add2(name+"_bench_cpu_us_per_run", tl.benchCPUus, as.benchCPUus)
		b.addInstr(name+"_redis_instructions_per_run", tl, as)
		return nil
	}
	b.rep.add2("redis_cpu_us_per_run", tl.redisCPUus, as.redisCPUus)
	b.rep.add2("redis_calls_per_run", tl.redisCalls, as.redisCalls)
	b.rep.add2("round_trips_per_1stage_run", tl.roundTrips, as.roundTrips)
	b.rep.add2("bench_cpu_us_per_run", tl.benchCPUus, as.benchCPUus)
	b.addInstr("redis_instructions_per_run", tl, as)
	b.rep.add2("bytes_per_finished_key", tl.bytesPerKey, as.bytesPerKey)
	b.rep.extra["bytes_by_kind"] = tl.bytesByKind
	b.rep.extra["asynq_bytes_by_kind"] = as.bytesByKind
	b.progress("bytes_per_finished_key rep %d: tasklease %.0f, asynq %.0f", rep, tl.bytesPerKey, as.bytesPerKey)

	asDefault, err := b.e2eAsynq(name, rep, asynqDefaultCheck, false)
	if err != nil {
		return fmt.Errorf("asynq (TaskCheckInterval %s): %w", asynqDefaultCheck, err)
	}
	b.rep.add("asynq_default_"+name+"_per_s", asDefault.rate)
	b.progress("%s rep %d: asynq with TaskCheckInterval %s: %.0f runs/s", name, rep, asynqDefaultCheck, asDefault.rate)
	return nil
}

// meter takes the before/after deltas of one measurement window.
type meter struct {
	b      *bench
	trips  *tripCounter
	srv    serverSnapshot
	proc   time.Duration
	trips0 int64
	fns0   map[string]int64
	start  time.Time
}

// addInstr reports the per-run instruction count as key when the bench
// runs Redis under callgrind.
func (b *bench) addInstr(key string, tl, as e2eResult) {
	if b.srv.callgrind {
		b.rep.add2(key, tl.redisInstr, as.redisInstr)
	}
}

func (b *bench) startMeter(trips *tripCounter) (*meter, error) {
	if err := b.admin.ConfigResetStat(b.ctx).Err(); err != nil {
		return nil, err
	}
	snap, err := takeSnapshot(b.ctx, b.admin)
	if err != nil {
		return nil, err
	}
	if b.srv.callgrind {
		if err := b.srv.instrOn(); err != nil {
			return nil, err
		}
	}
	return &meter{b: b, trips: trips, srv: snap, proc: processCPU(), trips0: trips.trips.Load(), fns0: trips.fcalls(), start: time.Now()}, nil
}

// stop ends the window: the rate and the per-run figures for n runs.
func (m *meter) stop(n int) (e2eResult, error) {
	elapsed := time.Since(m.start)
	trips := m.trips.trips.Load() - m.trips0
	var fcalls map[string]int64
	if fns := m.trips.fcalls(); fns != nil {
		fcalls = map[string]int64{}
		for k, v := range fns {
			if d := v - m.fns0[k]; d > 0 {
				fcalls[k] = d
			}
		}
	}
	proc := processCPU() - m.proc
	var instr int64
	if m.b.srv.callgrind {
		var err error
		if instr, err = m.b.srv.instrOff(); err != nil {
			return e2eResult{}, err
		}
	}
	snap, err := takeSnapshot(m.b.ctx, m.b.admin)
	if err != nil {
		return e2eResult{}, err
	}
	per := float64(n)
	return e2eResult{
		redisInstr: float64(instr) / per,
		rate:       per / elapsed.Seconds(),
		redisCPUus: float64((snap.cpu - m.srv.cpu).Microseconds()) / per,
		redisSysUs: float64((snap.sys - m.srv.sys).Microseconds()) / per,
		redisCalls: float64(snap.calls-m.srv.calls) / per,
		roundTrips: float64(trips) / per,
		benchCPUus: float64(proc.Microseconds()) / per,
		commands:   commandDeltas(m.srv.byCmd, snap.byCmd),
		fcalls:     fcalls,
	}, nil
}

// processCPU returns the user+sys CPU time of this process.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// tlVariant is what one tasklease end-to-end window varies: e2e_1stage,
// e2e_2stage and e2e_1stage_limited are the same measurement.
type tlVariant struct {
	stages    int
	withBytes bool                   // also: bytes per finished key
	config    func(cfg *jobs.Config) // nil, or changes the Registry's configuration (limiters)
	observe   func(run *jobs.Run)    // nil, or called by the last stage of every run
}

func (b *bench) e2eTasklease(name string, rep int, v tlVariant) (e2eResult, error) {
	n := b.sz.E2ERuns
	if err := b.reset(); err != nil {
		return e2eResult{}, err
	}
	var handled atomic.Int64
	var opts []func(*jobs.Config)
	if v.config != nil {
		opts = append(opts, v.config)
	}
	tl, err := b.newTasklease(stageHandlers(v.stages, func(_ context.Context, run *jobs.Run) {
		if v.observe != nil {
			v.observe(run)
		}
		handled.Add(1)
	}), opts...)
	if err != nil {
		return e2eResult{}, err
	}
	defer tl.close()
	if err := tl.startRunner(b.ctx); err != nil {
		return e2eResult{}, err
	}
	settle()
	ctx, cancel := context.WithTimeout(b.ctx, e2eTimeout)
	defer cancel()
	subject := func(i int) string { return "e" + strconv.Itoa(i) }

	m, err := b.startMeter(tl.trips)
	if err != nil {
		return e2eResult{}, err
	}
	err = parallel(ctx, n, clients, func(i int) error {
		r, err := tl.reg.Submit(ctx, subject(i), scope, jobs.SubmitOptions{Source: jobs.SourceManual})
		if err == nil && r.Outcome != jobs.OutcomeStarted {
			err = fmt.Errorf("submit %s: outcome %s, want started", subject(i), r.Outcome)
		}
		return err
	})
	if err != nil {
		return e2eResult{}, err
	}
	// The in-process counter says when the last handler ran; Redis says
	// when the last run was finished (its request acknowledged
	// by the finish script, with the record's status done).
	if err := waitUntil(ctx, e2eTimeout, time.Millisecond, func() (bool, error) { return handled.Load() >= int64(n), nil }); err != nil {
		return e2eResult{}, fmt.Errorf("handlers ran %d of %d runs: %w", handled.Load(), n, err)
	}
	if err := waitUntil(ctx, e2eTimeout, time.Millisecond, func() (bool, error) {
		stream, retry, err := tl.obs.QueueDepth(ctx)
		return stream == 0 && retry == 0, err
	}); err != nil {
		return e2eResult{}, fmt.Errorf("requests left in the queues: %w", err)
	}
	res, err := m.stop(n)
	if err != nil {
		return res, err
	}
	if err := tl.close(); err != nil {
		return res, err
	}

	done, err := b.countDone(ctx, tl.obs, n, subject)
	if err != nil {
		return res, err
	}
	b.check(fmt.Sprintf("%s rep %d tasklease: runs done in Redis", name, rep), done, int64(n))
	b.check(fmt.Sprintf("%s rep %d tasklease: handler calls", name, rep), handled.Load(), int64(n))
	if v.withBytes {
		bytes, byKind, err := memoryOfAllKeys(ctx, b.admin)
		if err != nil {
			return res, err
		}
		res.bytesPerKey, res.bytesByKind = float64(bytes)/float64(done), byKind
	}
	return res, nil
}

// countDone reads every key's record and counts those whose run is done.
func (b *bench) countDone(ctx context.Context, reg *jobs.Registry, n int, subject func(int) string) (int64, error) {
	var done atomic.Int64
	err := parallel(ctx, n, 16, func(i int) error {
		v, err := reg.Get(ctx, subject(i), scope)
		if errors.Is(err, jobs.ErrNotFound) {
			return nil
		}
		if err == nil && v.Status == jobs.StatusDone {
			done.Add(1)
		}
		return err
	})
	return done.Load(), err
}

// e2eAsynq measures an asynq server that polls its empty queues every
// check.
func (b *bench) e2eAsynq(name string, rep int, check time.Duration, withBytes bool) (e2eResult, error) {
	n := b.sz.E2ERuns
	if err := b.reset(); err != nil {
		return e2eResult{}, err
	}
	as := b.newAsynq()
	defer as.close()
	var handled atomic.Int64
	if err := as.startServer(asynq.Config{TaskCheckInterval: check}, func(context.Context, *asynq.Task) error { handled.Add(1); return nil }); err != nil {
		return e2eResult{}, err
	}
	settle()
	ctx, cancel := context.WithTimeout(b.ctx, e2eTimeout)
	defer cancel()

	m, err := b.startMeter(as.trips)
	if err != nil {
		return e2eResult{}, err
	}
	err = parallel(ctx, n, clients, func(i int) error {
		_, err := as.client.EnqueueContext(ctx, asynq.NewTask(taskType, []byte("e"+strconv.Itoa(i))),
			asynq.Unique(24*time.Hour), asynq.Retention(7*24*time.Hour))
		return err
	})
	if err != nil {
		return e2eResult{}, err
	}
	if err := waitUntil(ctx, e2eTimeout, time.Millisecond, func() (bool, error) { return handled.Load() >= int64(n), nil }); err != nil {
		return e2eResult{}, fmt.Errorf("handlers ran %d of %d tasks: %w", handled.Load(), n, err)
	}
	var qi *asynq.QueueInfo
	if err := waitUntil(ctx, e2eTimeout, time.Millisecond, func() (bool, error) {
		var err error
		qi, err = as.insp.GetQueueInfo("default")
		return err == nil && qi.Completed >= n, err
	}); err != nil {
		return e2eResult{}, fmt.Errorf("completed tasks: %w", err)
	}
	res, err := m.stop(n)
	if err != nil {
		return res, err
	}
	as.srv.Shutdown()
	as.srv = nil

	b.check(fmt.Sprintf("%s rep %d asynq: tasks completed in Redis", name, rep), int64(qi.Completed), int64(n))
	b.check(fmt.Sprintf("%s rep %d asynq: tasks processed in Redis", name, rep), int64(qi.ProcessedTotal), int64(n))
	b.check(fmt.Sprintf("%s rep %d asynq: handler calls", name, rep), handled.Load(), int64(n))
	if withBytes {
		bytes, byKind, err := memoryOfAllKeys(ctx, b.admin)
		if err != nil {
			return res, err
		}
		res.bytesPerKey, res.bytesByKind = float64(bytes)/float64(qi.Completed), byKind
	}
	return res, nil
}

// commandDeltas is after − before, by command, for commands that ran.
func commandDeltas(before, after map[string]cmdStat) map[string]cmdStat {
	out := map[string]cmdStat{}
	for k, a := range after {
		d := cmdStat{calls: a.calls - before[k].calls, usec: a.usec - before[k].usec}
		if d.calls > 0 {
			out[k] = d
		}
	}
	return out
}

// formatCommands lists commands by Redis time, each as calls and µs per
// run (a script's µs include the commands it called).
func formatCommands(cmds map[string]cmdStat, runs int) string {
	names := slices.SortedFunc(maps.Keys(cmds), func(a, b string) int {
		return cmp.Compare(cmds[b].usec, cmds[a].usec)
	})
	var sb strings.Builder
	per := float64(runs)
	for i, k := range names {
		if i > 0 {
			sb.WriteString(", ")
		}
		fmt.Fprintf(&sb, "%s %.2f× %.1fµs", k, float64(cmds[k].calls)/per, float64(cmds[k].usec)/per)
	}
	return sb.String()
}

// formatFcalls lists the FCALLs a client sent by function, most first, as
// calls per run.
func formatFcalls(fns map[string]int64, runs int) string {
	names := slices.SortedFunc(maps.Keys(fns), func(a, b string) int {
		return cmp.Or(cmp.Compare(fns[b], fns[a]), cmp.Compare(a, b))
	})
	var sb strings.Builder
	for i, k := range names {
		if i > 0 {
			sb.WriteString(", ")
		}
		fmt.Fprintf(&sb, "%s %.3f", k, float64(fns[k])/float64(runs))
	}
	return sb.String()
}
