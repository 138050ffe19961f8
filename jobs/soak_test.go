//go:build linux

// TestSoakChaos is a randomized chaos soak of the whole engine against a real
// redis-server. Three runners in this process are stopped gracefully (short
// grace: hand-back) and restarted, partitioned from Redis (every command
// fails) or put behind a slow link (heartbeats fail, other commands land
// late), and made stale holders on purpose (lease lost right after a stage
// returns, its completion held back until another runner executes the run:
// fencing must refuse it). Two child runner processes (this test binary
// re-executed as TestSoakHelperProcess) are SIGSTOPped past their leases'
// TTL and SIGKILLed at random, and restarted. They execute three jobs under
// a random load of submits (every source and policy) and cancels, with
// stages that succeed, fail, save progress, check their lease, outlive a
// heartbeat interval or block until stopped.
//
// Every stage execution is recorded (children append JSON lines to a shared
// file). After a drain (chaos stops, one runner finishes everything) the
// test checks DESIGN §2 and §3: every accepted request is reflected in a run
// that ended, with its follow-up when one was queued, and nothing is left
// queued, running, pending, leased or due for retry; grant tokens only grow,
// each names one owner and run, and executions start in token order; no two
// executions of a key overlap unless the earlier holder's context was
// cancelled by lease loss before the later one started (or its process was
// frozen, where only fencing protects); no stage is completed twice in a
// run, or completed by an execution that did not return nil, or run again
// once completed; every history event of a run is in a legal order and
// written by the holder of the run's current grant.
//
// Without TASKLEASE_SOAK it runs about six seconds of chaos (CI runs it with
// -race). The long version:
//
//	TASKLEASE_SOAK=10m go test -run TestSoakChaos -timeout 20m ./jobs/
//
// Each run logs its seed; TASKLEASE_SOAK_SEED=<n> reuses it: the random
// choices (load, behaviours, chaos timing) repeat, though the interleaving
// of goroutines and processes cannot.
package jobs

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
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
	"github.com/tasklease/tasklease/lua"
	"github.com/tasklease/tasklease/taskkey"
)

// Environment of the soak test and of its child runner processes.
const (
	soakEnvDuration = "TASKLEASE_SOAK"      // chaos duration (Go duration); unset: the short version
	soakEnvSeed     = "TASKLEASE_SOAK_SEED" // seed; unset: time

	soakEnvHelper    = "TASKLEASE_SOAK_HELPER"     // "1" in a child
	soakEnvAddr      = "TASKLEASE_SOAK_ADDR"       // redis host:port
	soakEnvPrefix    = "TASKLEASE_SOAK_PREFIX"     // Config.Prefix
	soakEnvLog       = "TASKLEASE_SOAK_LOG"        // shared JSON-lines file of child executions
	soakEnvProc      = "TASKLEASE_SOAK_PROC"       // child name, e.g. "child1.3" (index.generation)
	soakEnvChildSeed = "TASKLEASE_SOAK_CHILD_SEED" // the child's seed
	soakEnvHistCap   = "TASKLEASE_SOAK_HIST_CAP"   // Config.HistoryCap
)

const (
	soakShort        = 6 * time.Second
	soakPartitions   = 4
	soakSubjects     = 15 // × 3 scopes = 45 keys
	soakInProcess    = 3
	soakChildren     = 2
	soakConcurrency  = 4
	soakDrainTimeout = 15 * time.Second
	// soakCrossProcTol: executions in different processes are compared by
	// CLOCK_REALTIME with this tolerance (recording latency).
	soakCrossProcTol = 5 * time.Millisecond
	soakParent       = "parent"
)

// soakSpecs are the jobs of parent and children alike.
var soakSpecs = []struct {
	scope  string
	stages []string
	ttl    time.Duration
}{
	{"course_sync", []string{"pulling", "pushing"}, time.Second},
	{"message_sync", []string{"fetch", "apply", "ack"}, 800 * time.Millisecond},
	{"backup", []string{"snapshot", "upload"}, 600 * time.Millisecond},
}

func soakJobs(h Handler) []Job {
	var jobs []Job
	for _, sp := range soakSpecs {
		j := Job{Scope: sp.scope, LeaseTTL: sp.ttl,
			Retry: RetryPolicy{MaxAttempts: 4, Backoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond}}
		for _, st := range sp.stages {
			j.Stages = append(j.Stages, Stage{Name: st, Handler: h})
		}
		jobs = append(jobs, j)
	}
	return jobs
}

func soakStagesOf(scope string) []string {
	for _, sp := range soakSpecs {
		if sp.scope == scope {
			return sp.stages
		}
	}
	return nil
}

// soakExec is one stage execution; children write it as JSON lines, once
// at the start (ev "start") and once at the end (ev "end").
type soakExec struct {
	Ev          string `json:"ev,omitempty"`
	Proc        string `json:"proc"` // "parent" or the child's name
	Key         string `json:"key"`
	RunID       string `json:"runId"`
	Stage       string `json:"stage"`
	Owner       string `json:"owner"`
	Token       int64  `json:"token"`
	Attempt     int    `json:"attempt"`
	Behaviour   string `json:"beh"`
	Cursor      string `json:"cursor,omitempty"` // the saved progress the stage was handed
	Start       int64  `json:"start"`            // CLOCK_REALTIME, ns
	End         int64  `json:"end,omitempty"`
	Ended       bool   `json:"ended,omitempty"`
	Killed      bool   `json:"killed,omitempty"` // no end recorded: End is when the process was seen dead
	Outcome     string `json:"outcome,omitempty"`
	Cause       string `json:"cause,omitempty"`
	Lost        bool   `json:"lost,omitempty"`        // ended knowing the lease was lost
	CtxDone     int64  `json:"ctxDone,omitempty"`     // CLOCK_REALTIME ns when the stage context was seen done
	DeadAtStart bool   `json:"deadAtStart,omitempty"` // the stage context was already done when it started
}

func (e soakExec) String() string {
	end := "running"
	if e.Ended || e.Killed {
		end = time.Unix(0, e.End).Format("15:04:05.000000")
	}
	ctxDone := "-"
	if e.CtxDone != 0 {
		ctxDone = time.Unix(0, e.CtxDone).Format("15:04:05.000000")
	}
	return fmt.Sprintf("[%s %s run %s stage %s token %d owner %s attempt %d beh %s %s..%s ctx done %s outcome %s lost=%v killed=%v cause=%q]",
		e.Proc, e.Key, soakShortID(e.RunID), e.Stage, e.Token, e.Owner, e.Attempt, e.Behaviour,
		time.Unix(0, e.Start).Format("15:04:05.000000"), end, ctxDone, e.Outcome, e.Lost, e.Killed, e.Cause)
}

func soakShortID(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}

var errSoakTransient = errors.New("soak: transient stage failure")

// soakBehaviour is the stage handler of every job: each execution picks a
// random behaviour and is recorded through begin/end.
type soakBehaviour struct {
	mu    sync.Mutex
	rng   *rand.Rand
	drain <-chan struct{} // closed when the parent drains (nil in children)
	begin func(soakExec) int
	end   func(int, soakExec)
	// stale (in-process only) makes the write that follows this execution
	// land after the run was taken over; false when it cannot now.
	stale func(run *Run) bool
	// stretched: executions of the key should take long now, so that a
	// late write lands while one runs.
	stretched func(key string) bool
}

func (b *soakBehaviour) draining() bool {
	select {
	case <-b.drain:
		return true
	default:
		return false
	}
}

// pick chooses what this execution does and for how long.
func (b *soakBehaviour) pick(ttl time.Duration) (string, time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	quick := time.Duration(b.rng.IntN(5000)) * time.Microsecond
	n := b.rng.IntN(100)
	if b.draining() {
		if n < 20 {
			return "progress", quick
		}
		return "quick", quick
	}
	switch {
	case n < 2:
		return "stale", 0
	case n < 48:
		return "quick", quick
	case n < 60:
		return "fail", quick
	case n < 69:
		return "progress", quick
	case n < 74:
		return "progress-fail", quick
	case n < 81:
		return "check", quick
	case n < 97: // longer than a renewal interval: heartbeats matter
		return "long", ttl*35/100 + time.Duration(b.rng.Int64N(int64(ttl*45/100)))
	default:
		return "block", 0
	}
}

func (b *soakBehaviour) RunStage(ctx context.Context, run *Run) error {
	now := time.Now()
	e := soakExec{Key: run.Key().String(), RunID: run.RunID(), Stage: run.Stage(), Owner: run.Owner(),
		Token: run.FencingToken(), Attempt: run.Attempt(), Cursor: string(run.Cursor()), Start: now.UnixNano()}
	e.DeadAtStart = ctx.Err() != nil // after the timestamp: dead now means dead then
	var d time.Duration
	ttl := 3 * run.StopGrace() // StopGrace is TTL/3
	e.Behaviour, d = b.pick(ttl)
	switch {
	case b.stretched != nil && b.stretched(e.Key) && !b.draining():
		e.Behaviour, d = "long", ttl*3/2
	case e.Behaviour == "stale" && (b.stale == nil || !b.stale(run)):
		e.Behaviour = "quick"
	}
	id := b.begin(e)
	var ctxDone atomic.Int64
	stop := context.AfterFunc(ctx, func() { ctxDone.Store(time.Now().UnixNano()) })
	err := b.act(ctx, run, e.Behaviour, d)
	stop()
	cause := context.Cause(ctx)
	e.Lost = errors.Is(cause, leasing.ErrLost) || errors.Is(err, leasing.ErrNotHeld)
	switch {
	case err == nil:
		e.Outcome = "ok"
	case errors.Is(cause, leasing.ErrLost) || errors.Is(err, leasing.ErrNotHeld):
		e.Outcome = "lost"
	case errors.Is(cause, ErrCancelled):
		e.Outcome = "cancelled"
	case errors.Is(cause, ErrShutdown):
		e.Outcome = "shutdown"
	default:
		e.Outcome = "error"
	}
	if cause != nil {
		e.Cause = cause.Error()
	} else if err != nil {
		e.Cause = err.Error()
	}
	e.End, e.Ended = time.Now().UnixNano(), true // last: the end is no earlier than what was seen
	if cd := ctxDone.Load(); cd != 0 && cd <= e.End {
		e.CtxDone = cd
	}
	b.end(id, e)
	return err
}

func (b *soakBehaviour) act(ctx context.Context, run *Run, beh string, d time.Duration) error {
	switch beh {
	case "fail":
		if err := soakSleep(ctx, d); err != nil {
			return err
		}
		return errSoakTransient
	case "progress", "progress-fail":
		if err := soakSleep(ctx, d/2); err != nil {
			return err
		}
		cur := fmt.Sprintf("%s/%s/%d", run.RunID(), run.Stage(), run.FencingToken())
		if err := run.SaveProgress(ctx, []byte(cur)); err != nil {
			return err
		}
		if err := soakSleep(ctx, d/2); err != nil || beh == "progress" {
			return err
		}
		return errSoakTransient // the retry resumes from the cursor
	case "check":
		if err := run.CheckLease(ctx); err != nil {
			return err
		}
		return soakSleep(ctx, d)
	case "stale":
		return nil
	case "block":
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-b.drain:
			return nil
		}
	default: // quick, long
		return soakSleep(ctx, d)
	}
}

func soakSleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// TestSoakHelperProcess is not a test: it is a child runner process of
// TestSoakChaos. Without TASKLEASE_SOAK_HELPER=1 it skips.
func TestSoakHelperProcess(t *testing.T) {
	if os.Getenv(soakEnvHelper) != "1" {
		t.Skip("helper process for TestSoakChaos")
	}
	proc := os.Getenv(soakEnvProc)
	seed, err := strconv.ParseUint(os.Getenv(soakEnvChildSeed), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	histCap, err := strconv.Atoi(os.Getenv(soakEnvHistCap))
	if err != nil {
		t.Fatal(err)
	}
	logf, err := os.OpenFile(os.Getenv(soakEnvLog), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	var mu sync.Mutex
	write := func(ev string, e soakExec) {
		e.Ev, e.Proc = ev, proc
		b, err := json.Marshal(e)
		if err != nil {
			panic(err)
		}
		mu.Lock()
		defer mu.Unlock()
		// One O_APPEND write per line: whole lines, even under SIGKILL.
		if _, err := logf.Write(append(b, '\n')); err != nil {
			panic(err)
		}
	}
	beh := &soakBehaviour{rng: rand.New(rand.NewPCG(seed, 1)),
		begin: func(e soakExec) int { write("start", e); return 0 },
		end:   func(_ int, e soakExec) { write("end", e) }}
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv(soakEnvAddr), PoolSize: 64})
	defer rdb.Close()
	reg, err := NewRegistry(rdb, Config{Prefix: os.Getenv(soakEnvPrefix), Partitions: soakPartitions,
		HistoryCap: histCap, Jobs: soakJobs(beh), Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	id, _, _ := strings.Cut(proc, ".")
	runChildRunner(t, reg, RunnerConfig{ID: "soak-" + id, Concurrency: soakConcurrency, LeaseTTL: time.Second}, 30*time.Minute)
}

type soakSubmit struct {
	key        taskkey.Key
	source     Source
	policy     Policy
	outcome    Outcome
	runID      string // the run the answer shows (a queued request's: the run it waits behind)
	servedBy   string // the run that serves the request (SubmitResult.RunID)
	status     Status // of the run after the request
	start, end time.Time
}

type soakCancel struct {
	key        taskkey.Key
	outcome    CancelOutcome
	start, end time.Time
}

// soakSlot is one in-process runner, stopped and restarted at random.
type soakSlot struct {
	id     string
	reg    *Registry
	cut    *soakCut
	cancel context.CancelFunc
	done   chan error
}

type soakChild struct {
	proc    string
	cmd     *exec.Cmd
	exited  chan struct{}
	waitErr error
	out     *redistest.LogBuffer
	killed  atomic.Bool
}

type soakTest struct {
	t        *testing.T
	seed     uint64
	srv      *redistest.Server
	prefix   string
	histCap  int
	drain    chan struct{}
	childLog string
	reg      *Registry // load, views and checks
	rdb      *redis.Client
	keys     []taskkey.Key

	rngMu sync.Mutex
	rng   *rand.Rand

	recMu sync.Mutex
	execs []soakExec // in-process executions

	childMu  sync.Mutex
	children map[string]*soakChild // live children by proc
	deaths   map[string]int64      // proc → CLOCK_REALTIME ns when seen dead
	pauses   map[string][][2]int64 // proc → SIGSTOP..SIGCONT intervals, CLOCK_REALTIME ns

	loadMu  sync.Mutex
	submits []soakSubmit
	cancels []soakCancel

	kills, childStarts, restarts, pauseN, cutN, slowN, startFailures, staleN atomic.Int64

	staleMu    sync.Mutex
	slotOf     map[string]*soakSlot // runner owner → its slot
	lastStale  time.Time
	stretch    map[string]time.Time // key → executions are long until then
	lateWrites *soakCounter
}

// soakCut is a go-redis hook that partitions one client's runner from Redis
// though its goroutines live on. While down every command fails. While
// delay is set heartbeats fail and every other command reaches Redis that
// much later, whatever happened to its context meanwhile (bytes already on
// the wire of another connection): the runner loses its leases while its
// stage completions and finishes are still in flight, and they land after
// another runner took over — fencing must reject them.
type soakCut struct {
	down        atomic.Bool
	delay       atomic.Int64 // ns
	hbFailUntil atomic.Int64 // heartbeats fail until then (CLOCK_REALTIME ns)
	hold        atomic.Pointer[soakHold]
	// late counts the delayed fenced writes by script and whether they
	// were refused ("advance refused", "finish accepted", ...).
	late *soakCounter
}

type soakCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *soakCounter) add(k string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[k]++
}

func (c *soakCounter) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for k, n := range c.n {
		out = append(out, fmt.Sprintf("%s %d", k, n))
	}
	slices.Sort(out)
	return strings.Join(out, ", ")
}

// soakFencedScripts are the scripts whose reply says "not held" as {0} or 0.
var soakFencedScripts = func() map[string]string {
	m := map[string]string{}
	for name, short := range map[string]string{"checkpoint_advance": "advance", "checkpoint_progress": "progress", "finish": "finish"} {
		for _, sha := range scriptSHAs(name) {
			m[sha] = short
		}
	}
	return m
}()

// soakRefused reports whether a fenced script's reply says "not held".
func soakRefused(cmd redis.Cmder) bool {
	c, ok := cmd.(*redis.Cmd)
	if !ok || c.Err() != nil {
		return false
	}
	switch v := c.Val().(type) {
	case int64:
		return v == 0
	case []any:
		return len(v) > 0 && v[0] == int64(0)
	}
	return false
}

// soakHold holds back the next command naming leaseKey (a stale holder's
// fenced write) until ready (another runner executes the run) or until.
type soakHold struct {
	leaseKey string
	until    time.Time
	ready    func() bool
	drain    <-chan struct{} // closed: stop holding (the test drains)
}

func (h *soakHold) wait() {
	for !h.ready() && time.Now().Before(h.until) {
		select {
		case <-h.drain:
			return
		case <-time.After(5 * time.Millisecond):
		}
	}
}

func soakMentions(cmd redis.Cmder, s string) bool {
	for _, a := range cmd.Args() {
		if a == s {
			return true
		}
	}
	return false
}

var soakHeartbeatSHAs = scriptSHAs("heartbeat")

func soakIsHeartbeat(cmd redis.Cmder) bool {
	args := cmd.Args()
	if len(args) < 2 {
		return false
	}
	name, _ := args[0].(string)
	body, _ := args[1].(string)
	switch strings.ToLower(name) {
	case "evalsha":
		return slices.Contains(soakHeartbeatSHAs, body)
	case "fcall":
		script, _ := lua.ScriptOfFunction(body)
		return script == "heartbeat"
	case "eval":
		return strings.Contains(body, "\n-- heartbeat.lua\n")
	}
	return false
}

var errSoakCut = errors.New("soak: partitioned from redis")

func (c *soakCut) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *soakCut) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if c.down.Load() {
			cmd.SetErr(errSoakCut)
			return errSoakCut
		}
		d := c.delay.Load()
		if soakIsHeartbeat(cmd) && (d > 0 || time.Now().UnixNano() < c.hbFailUntil.Load()) {
			cmd.SetErr(errSoakCut)
			return errSoakCut
		}
		h := c.hold.Load()
		if h != nil && time.Now().After(h.until) {
			c.hold.CompareAndSwap(h, nil) // the holder never wrote again
			h = nil
		}
		if h != nil && !soakMentions(cmd, h.leaseKey) {
			h = nil
		}
		if d > 0 || h != nil {
			if h != nil {
				c.hold.CompareAndSwap(h, nil)
				h.wait()
				kind := "command"
				if args := cmd.Args(); len(args) > 1 && soakFencedScripts[fmt.Sprint(args[1])] != "" {
					kind = soakFencedScripts[fmt.Sprint(args[1])]
				}
				if h.ready() {
					c.late.add("held " + kind + " sent during the new holder's stage:")
				} else {
					c.late.add("held " + kind + " sent without a new in-process holder:")
				}
			} else {
				time.Sleep(time.Duration(d))
			}
			err := next(context.WithoutCancel(ctx), cmd)
			if args := cmd.Args(); len(args) > 1 && soakFencedScripts[fmt.Sprint(args[1])] != "" {
				what := " accepted"
				if soakRefused(cmd) {
					what = " refused"
				}
				c.late.add(soakFencedScripts[fmt.Sprint(args[1])] + what)
			}
			return err
		}
		return next(ctx, cmd)
	}
}

func (c *soakCut) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if c.down.Load() {
			for _, cmd := range cmds {
				cmd.SetErr(errSoakCut)
			}
			return errSoakCut
		}
		if d := c.delay.Load(); d > 0 {
			time.Sleep(time.Duration(d))
			return next(context.WithoutCancel(ctx), cmds)
		}
		return next(ctx, cmds)
	}
}

// paused reports whether proc was stopped (SIGSTOP) at some time in
// [from, to].
func (st *soakTest) paused(proc string, from, to int64) bool {
	st.childMu.Lock()
	defer st.childMu.Unlock()
	for _, p := range st.pauses[proc] {
		if p[0] <= to && p[1] >= from {
			return true
		}
	}
	return false
}

// newRand returns an independent generator drawn from the test's seed.
func (st *soakTest) newRand() *rand.Rand {
	st.rngMu.Lock()
	defer st.rngMu.Unlock()
	return rand.New(rand.NewPCG(st.rng.Uint64(), st.rng.Uint64()))
}

func (st *soakTest) nextSeed() uint64 {
	st.rngMu.Lock()
	defer st.rngMu.Unlock()
	return st.rng.Uint64()
}

func (st *soakTest) newRegistry(h Handler, pool int, hooks ...redis.Hook) *Registry {
	rdb := redis.NewClient(&redis.Options{Addr: st.srv.Addr(), PoolSize: pool})
	for _, hk := range hooks {
		rdb.AddHook(hk)
	}
	st.t.Cleanup(func() { _ = rdb.Close() })
	reg, err := NewRegistry(rdb, Config{Prefix: st.prefix, Partitions: soakPartitions, HistoryCap: st.histCap,
		Jobs: soakJobs(h), Logger: testLogger(st.t)})
	if err != nil {
		st.t.Fatal(err)
	}
	return reg
}

func (st *soakTest) startSlot(sl *soakSlot, grace time.Duration) {
	rn, err := NewRunner(sl.reg, RunnerConfig{ID: sl.id, Concurrency: soakConcurrency, LeaseTTL: time.Second,
		ShutdownGrace: grace, FetchBlock: 100 * time.Millisecond, RetryPoll: 20 * time.Millisecond})
	if err != nil {
		st.t.Error(err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	sl.cancel, sl.done = cancel, make(chan error, 1)
	st.staleMu.Lock()
	st.slotOf[rn.Owner()] = sl
	st.staleMu.Unlock()
	go func() { sl.done <- rn.Run(ctx) }()
}

// makeStale makes run's holder lose its lease right after this stage
// returns while the completion it sends (advance or finish) is in flight
// long enough to land after another runner took the run over (during a
// stretched execution of the same stage): fencing must refuse it.
func (st *soakTest) makeStale(run *Run) bool {
	st.staleMu.Lock()
	defer st.staleMu.Unlock()
	sl := st.slotOf[run.Owner()]
	if sl == nil || time.Since(st.lastStale) < 1500*time.Millisecond {
		return false
	}
	st.lastStale = time.Now()
	ttl := 3 * run.StopGrace()
	now := time.Now()
	// No renewal is confirmed before the keeper's deadline (2/3 TTL after
	// the last one): it gives up, the lease expires, another runner takes
	// over. The holder's next write (advance or finish) is held back until
	// an in-process runner executes the run under a newer token (its
	// executions of the key are stretched meanwhile), or a while.
	sl.cut.hbFailUntil.Store(now.Add(ttl*2/3 + 100*time.Millisecond).UnixNano())
	key, token := run.Key().String(), run.FencingToken()
	st.stretch[key] = now.Add(5 * time.Second)
	sl.cut.hold.Store(&soakHold{leaseKey: st.reg.ks.Lease(run.Key()), until: now.Add(4 * time.Second),
		ready: func() bool { return st.runningNewer(key, token) }, drain: st.drain})
	st.staleN.Add(1)
	return true
}

// runningNewer reports whether an in-process execution of key under a
// token above token is running.
func (st *soakTest) runningNewer(key string, token int64) bool {
	st.recMu.Lock()
	defer st.recMu.Unlock()
	for i := len(st.execs) - 1; i >= max(0, len(st.execs)-5000); i-- { // recent ones suffice
		if e := st.execs[i]; e.Key == key && e.Token > token && !e.Ended {
			return true
		}
	}
	return false
}

func (st *soakTest) stretched(key string) bool {
	st.staleMu.Lock()
	defer st.staleMu.Unlock()
	return time.Now().Before(st.stretch[key])
}

// stopSlot stops the runner gracefully and returns Run's error: a runner
// started while partitioned, or stopped while starting, fails to start.
func (st *soakTest) stopSlot(sl *soakSlot) error {
	if sl.cancel == nil {
		return nil
	}
	sl.cancel()
	err := <-sl.done
	sl.cancel = nil
	return err
}

func (st *soakTest) startChild(idx, gen int) *soakChild {
	c := &soakChild{proc: fmt.Sprintf("child%d.%d", idx, gen), exited: make(chan struct{}), out: &redistest.LogBuffer{}}
	c.cmd = exec.Command(os.Args[0], "-test.run=^TestSoakHelperProcess$", "-test.count=1")
	c.cmd.Env = append(os.Environ(), soakEnvHelper+"=1", soakEnvAddr+"="+st.srv.Addr(), soakEnvPrefix+"="+st.prefix,
		soakEnvLog+"="+st.childLog, soakEnvProc+"="+c.proc, soakEnvChildSeed+"="+strconv.FormatUint(st.nextSeed(), 10),
		soakEnvHistCap+"="+strconv.Itoa(st.histCap))
	c.cmd.Stdout, c.cmd.Stderr = c.out, c.out
	// Own process group, and SIGKILL from the kernel if this process dies.
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := c.cmd.Start(); err != nil {
		st.t.Errorf("start child runner: %v", err)
		close(c.exited)
		return c
	}
	st.childStarts.Add(1)
	st.childMu.Lock()
	st.children[c.proc] = c
	st.childMu.Unlock()
	go func() {
		c.waitErr = c.cmd.Wait()
		st.childMu.Lock()
		st.deaths[c.proc] = time.Now().UnixNano()
		delete(st.children, c.proc)
		st.childMu.Unlock()
		close(c.exited)
	}()
	return c
}

func (st *soakTest) killChild(c *soakChild) {
	if c.cmd.Process == nil {
		return
	}
	select {
	case <-c.exited:
		return
	default:
	}
	c.killed.Store(true)
	_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
	<-c.exited
	st.kills.Add(1)
}

// pause stops c's process group for d (SIGSTOP, SIGCONT).
func (st *soakTest) pause(ctx context.Context, c *soakChild, d time.Duration) {
	select {
	case <-c.exited:
		return
	default:
	}
	from := time.Now().UnixNano()
	if err := syscall.Kill(-c.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		return
	}
	st.pauseN.Add(1)
	_ = soakSleep(ctx, d)
	_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGCONT)
	to := time.Now().UnixNano()
	st.childMu.Lock()
	st.pauses[c.proc] = append(st.pauses[c.proc], [2]int64{from, to})
	st.childMu.Unlock()
}

// manageChild runs child idx: start, live a random while, SIGKILL, repeat.
func (st *soakTest) manageChild(ctx context.Context, idx int) {
	rng := st.newRand()
	for gen := 0; ctx.Err() == nil; gen++ {
		c := st.startChild(idx, gen)
		life := 400*time.Millisecond + time.Duration(rng.Int64N(int64(2100*time.Millisecond)))
		if rng.IntN(100) < 40 {
			// Freeze it (a GC pause, a stopped VM) past its leases' TTL,
			// then let it go on for a while: only fencing stops its writes.
			select {
			case <-ctx.Done():
			case <-time.After(life / 2):
			case <-c.exited:
			}
			st.pause(ctx, c, 300*time.Millisecond+time.Duration(rng.Int64N(int64(1500*time.Millisecond))))
		}
		select {
		case <-ctx.Done():
		case <-time.After(life):
		case <-c.exited:
		}
		select {
		case <-c.exited:
			if !c.killed.Load() {
				st.t.Errorf("child runner %s exited by itself: %v\n%s", c.proc, c.waitErr, c.out.String())
				return
			}
		default:
		}
		st.killChild(c)
		if soakSleep(ctx, time.Duration(rng.Int64N(int64(300*time.Millisecond)))) != nil {
			return
		}
	}
}

// manageSlots stops one in-process runner gracefully (short grace: running
// stages are handed back) and restarts it, at random, until ctx ends.
func (st *soakTest) manageSlots(ctx context.Context, slots []*soakSlot) {
	rng := st.newRand()
	for {
		if soakSleep(ctx, 200*time.Millisecond+time.Duration(rng.Int64N(int64(time.Second)))) != nil {
			return
		}
		sl := slots[rng.IntN(len(slots))]
		if err := st.stopSlot(sl); err != nil {
			st.startFailures.Add(1) // cut off or stopped while starting
		}
		st.restarts.Add(1)
		pause := time.Duration(rng.Int64N(int64(300 * time.Millisecond)))
		grace := 20*time.Millisecond + time.Duration(rng.Int64N(int64(280*time.Millisecond)))
		_ = soakSleep(ctx, pause)
		st.startSlot(sl, grace)
	}
}

// cutSlots partitions one in-process runner from Redis at a time, for
// less or more than its leases' renew deadline: its heartbeats fail, its
// stages must stop before the leases expire, and others take over.
func (st *soakTest) cutSlots(ctx context.Context, slots []*soakSlot) {
	rng := st.newRand()
	for soakSleep(ctx, 300*time.Millisecond+time.Duration(rng.Int64N(int64(1500*time.Millisecond)))) == nil {
		sl := slots[rng.IntN(len(slots))]
		if rng.IntN(3) == 0 {
			sl.cut.down.Store(true)
			st.cutN.Add(1)
		} else {
			sl.cut.delay.Store(int64(500*time.Millisecond + time.Duration(rng.Int64N(int64(1000*time.Millisecond)))))
			st.slowN.Add(1)
		}
		_ = soakSleep(ctx, 100*time.Millisecond+time.Duration(rng.Int64N(int64(1100*time.Millisecond))))
		sl.cut.down.Store(false)
		sl.cut.delay.Store(0)
	}
}

func (st *soakTest) submitLoop(ctx context.Context) {
	rng := st.newRand()
	sources := []Source{SourceSchedule, SourceForeground, SourceManual, SourceRetry}
	for ctx.Err() == nil {
		k := st.keys[rng.IntN(len(st.keys))]
		pol := PolicyJoin
		switch n := rng.IntN(100); {
		case n < 12:
			pol = PolicyQueue
		case n < 20:
			pol = PolicySkip
		case n < 28:
			pol = PolicyReplace
		}
		src := sources[rng.IntN(len(sources))]
		start := time.Now()
		res, err := st.reg.Submit(context.Background(), k.Subject(), k.Scope(), SubmitOptions{Source: src, Policy: pol})
		end := time.Now()
		if err != nil {
			st.t.Errorf("submit %s: %v", k, err)
			return
		}
		st.loadMu.Lock()
		st.submits = append(st.submits, soakSubmit{key: k, source: src, policy: pol, outcome: res.Outcome,
			runID: res.Task.RunID, servedBy: res.RunID, status: res.Task.Status, start: start, end: end})
		st.loadMu.Unlock()
		_ = soakSleep(ctx, time.Duration(2+rng.IntN(14))*time.Millisecond)
	}
}

func (st *soakTest) cancelLoop(ctx context.Context) {
	rng := st.newRand()
	for soakSleep(ctx, time.Duration(50+rng.IntN(200))*time.Millisecond) == nil {
		k := st.keys[rng.IntN(len(st.keys))]
		start := time.Now()
		out, err := st.reg.Cancel(context.Background(), k.Subject(), k.Scope())
		end := time.Now()
		if err != nil {
			st.t.Errorf("cancel %s: %v", k, err)
			return
		}
		st.loadMu.Lock()
		st.cancels = append(st.cancels, soakCancel{key: k, outcome: out, start: start, end: end})
		st.loadMu.Unlock()
	}
}

func TestSoakChaos(t *testing.T) {
	dur, long := soakShort, false
	if v := os.Getenv(soakEnvDuration); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("%s=%q: want a positive Go duration", soakEnvDuration, v)
		}
		dur, long = d, true
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv(soakEnvSeed); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("%s=%q: %v", soakEnvSeed, v, err)
		}
		seed = s
	}
	t.Logf("soak: seed %d (replay: %s=%d), chaos for %s", seed, soakEnvSeed, seed, dur)

	srv := redistest.StartServer(t)
	st := &soakTest{t: t, seed: seed, srv: srv, prefix: "soak", histCap: 2000,
		drain: make(chan struct{}), childLog: filepath.Join(t.TempDir(), "children.jsonl"),
		rng: rand.New(rand.NewPCG(seed, 0x50a4)), children: map[string]*soakChild{}, deaths: map[string]int64{},
		pauses: map[string][][2]int64{}, lateWrites: &soakCounter{n: map[string]int{}},
		slotOf: map[string]*soakSlot{}, stretch: map[string]time.Time{}}
	if long {
		st.histCap = max(2000, int(dur.Seconds()*20)) // about 12 events per key and second

	}
	t.Cleanup(func() { // never leave a child behind, whatever happened
		st.childMu.Lock()
		live := make([]*soakChild, 0, len(st.children))
		for _, c := range st.children {
			live = append(live, c)
		}
		st.childMu.Unlock()
		for _, c := range live {
			st.killChild(c)
			if t.Failed() {
				t.Logf("child %s output:\n%s", c.proc, c.out.String())
			}
		}
	})
	beh := &soakBehaviour{rng: st.newRand(), drain: st.drain, stale: st.makeStale, stretched: st.stretched,
		begin: func(e soakExec) int {
			e.Proc = soakParent
			st.recMu.Lock()
			defer st.recMu.Unlock()
			st.execs = append(st.execs, e)
			return len(st.execs) - 1
		},
		end: func(i int, e soakExec) {
			e.Proc = soakParent
			st.recMu.Lock()
			defer st.recMu.Unlock()
			st.execs[i] = e
		}}
	st.reg = st.newRegistry(beh, 32)
	st.rdb = st.reg.rdb.(*redis.Client)
	for _, sp := range soakSpecs {
		for i := range soakSubjects {
			st.keys = append(st.keys, taskkey.MustNew(fmt.Sprintf("u%02d", i), sp.scope))
		}
	}

	// Runners: three here (each its own client, as separate pods), two
	// children.
	slots := make([]*soakSlot, soakInProcess)
	for i := range slots {
		cut := &soakCut{late: st.lateWrites}
		slots[i] = &soakSlot{id: fmt.Sprintf("soak-p%d", i), cut: cut, reg: st.newRegistry(beh, 32, cut)}
		st.startSlot(slots[i], 200*time.Millisecond)
	}
	chaosCtx, stopChaos := context.WithTimeout(context.Background(), dur)
	defer stopChaos()
	var chaos sync.WaitGroup
	for i := range soakChildren {
		chaos.Go(func() { st.manageChild(chaosCtx, i) })
	}
	chaos.Go(func() { st.manageSlots(chaosCtx, slots) })
	chaos.Go(func() { st.cutSlots(chaosCtx, slots) })
	for range 2 {
		chaos.Go(func() { st.submitLoop(chaosCtx) })
	}
	chaos.Go(func() { st.cancelLoop(chaosCtx) })
	chaos.Wait()

	// Drain: stages finish quickly now; one runner finishes everything.
	close(st.drain)
	drainStart := time.Now()
	for _, sl := range slots {
		sl.cut.down.Store(false)
		sl.cut.delay.Store(0)
		if err := st.stopSlot(sl); err != nil {
			st.startFailures.Add(1)
		}
	}
	st.startSlot(slots[0], 200*time.Millisecond)
	st.waitDrained(drainStart)
	drained := time.Since(drainStart)
	if err := st.stopSlot(slots[0]); err != nil {
		t.Errorf("drain runner: %v", err)
	}
	if t.Failed() {
		t.FailNow()
	}
	st.check(dur, drained)
}

// drainState reports what is still unfinished; "" when drained.
func (st *soakTest) drainState(verbose bool) string {
	ctx := context.Background()
	var out []string
	for _, k := range st.keys {
		v, err := st.reg.Get(ctx, k.Subject(), k.Scope())
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return err.Error()
		}
		if v.Status.Active() {
			out = append(out, fmt.Sprintf("%s %s run %s stage %q owner %s token %d attempt %d",
				k, v.Status, soakShortID(v.RunID), v.Stage, v.Owner, v.FencingToken, v.Attempt))
		}
		if n, _ := st.rdb.Exists(ctx, st.reg.ks.Lease(k)).Result(); n != 0 {
			val, _ := st.rdb.Get(ctx, st.reg.ks.Lease(k)).Result()
			out = append(out, fmt.Sprintf("%s lease %q still held (status %s)", k, val, v.Status))
		}
	}
	for p := range soakPartitions {
		if lines, empty := queueState(ctx, st.rdb, st.reg, p); !empty {
			out = append(out, lines...)
		}
		if n, _ := st.rdb.ZCard(ctx, st.reg.ks.Retry(p)).Result(); n != 0 {
			members, _ := st.rdb.ZRangeWithScores(ctx, st.reg.ks.Retry(p), 0, -1).Result()
			out = append(out, fmt.Sprintf("%s: %d retries %v", st.reg.ks.Retry(p), n, members))
		}
	}
	return strings.Join(out, "\n")
}

func (st *soakTest) waitDrained(start time.Time) {
	deadline := start.Add(soakDrainTimeout)
	for {
		left := st.drainState(false)
		if left == "" {
			return
		}
		if time.Now().After(deadline) {
			st.t.Fatalf("seed %d: not drained %s after the chaos ended:\n%s", st.seed, soakDrainTimeout, st.drainState(true))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// readChildExecs merges the children's start and end lines; an execution
// with no end line ran until its process was killed.
func (st *soakTest) readChildExecs() []soakExec {
	f, err := os.Open(st.childLog)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		st.t.Fatal(err)
	}
	defer f.Close()
	type id struct {
		owner, key, stage string
		token             int64
	}
	var order []id
	byID := map[id]*soakExec{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		var e soakExec
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			st.t.Fatalf("child log line %q: %v", sc.Text(), err)
		}
		i := id{e.Owner, e.Key, e.Stage, e.Token}
		switch e.Ev {
		case "start":
			if byID[i] != nil {
				st.t.Errorf("child log: execution %v started twice", i)
				continue
			}
			byID[i] = &e
			order = append(order, i)
		case "end":
			if byID[i] == nil {
				st.t.Errorf("child log: end without start: %s", e)
				continue
			}
			*byID[i] = e
		}
	}
	if err := sc.Err(); err != nil {
		st.t.Fatal(err)
	}
	out := make([]soakExec, 0, len(order))
	for _, i := range order {
		e := *byID[i]
		if !e.Ended {
			st.childMu.Lock()
			death, ok := st.deaths[e.Proc]
			st.childMu.Unlock()
			if !ok {
				st.t.Errorf("child execution of a process never seen dead: %s", e)
				continue
			}
			e.End, e.Killed = death, true
		}
		e.Ev = ""
		out = append(out, e)
	}
	return out
}

type soakGrant struct {
	owner, runID string
	at           int64 // Redis TIME (the same host clock), ns, millisecond precision
}

// soakRun is what one run's history says.
type soakRun struct {
	id        string
	complete  bool // its history starts with its creation
	ended     string
	holding   bool
	grantTok  int64
	grantOwn  string
	doneTok   map[string]int64 // stage → token of its "stage done" event
	doneOwner map[string]string
	nDone     int
	events    []string
	// progress: stage → token of its last "progress" event (cleared when
	// the stage is done); cursorOf: grant token → progress at the grant.
	progress map[string]int64
	cursorOf map[int64]map[string]int64
}

// expectCursor is the cursor an execution of stage under token must be
// handed: the last progress saved in that stage before the grant.
func (r *soakRun) expectCursor(stage string, token int64) string {
	if tok, ok := r.cursorOf[token][stage]; ok {
		return fmt.Sprintf("%s/%s/%d", r.id, stage, tok)
	}
	return ""
}

func (st *soakTest) check(dur, drained time.Duration) {
	t := st.t
	ctx := context.Background()
	var bad []string
	violate := func(format string, args ...any) { bad = append(bad, fmt.Sprintf(format, args...)) }

	st.recMu.Lock()
	parentExecs := slices.Clone(st.execs)
	st.recMu.Unlock()
	childExecs := st.readChildExecs()
	all := append(slices.Clone(parentExecs), childExecs...)
	for _, e := range parentExecs {
		if !e.Ended {
			violate("in-process execution never ended (all runners stopped): %s", e)
		}
	}

	byKey := map[string][]soakExec{}
	for _, e := range all {
		byKey[e.Key] = append(byKey[e.Key], e)
	}

	stats := map[string]int{}
	finals := map[Status]int{}
	runs := map[string]*soakRun{} // every run seen, by id
	keyRuns := map[string]map[string]*soakRun{}
	trimmedKeys := 0
	for _, k := range st.keys {
		ks := k.String()
		v, err := st.reg.Get(ctx, k.Subject(), k.Scope())
		switch {
		case errors.Is(err, ErrNotFound):
			finals["never"]++
		case err != nil:
			t.Fatal(err)
		default:
			finals[v.Status]++
			if v.Status.Active() {
				violate("%s: final status %s (run %s), want terminal", ks, v.Status, v.RunID)
			}
		}
		// 5 (and 2, 4): the key's history, run by run; a key whose history
		// reached the cap lost its oldest events, and their runs are not
		// checked.
		hist, err := st.reg.History(ctx, k.Subject(), k.Scope(), st.histCap)
		if err != nil {
			t.Fatal(err)
		}
		slices.Reverse(hist)
		trimmed := len(hist) >= st.histCap
		if trimmed {
			trimmedKeys++
		}
		rs, grants := st.checkHistory(ks, hist, trimmed, violate, stats)
		keyRuns[ks] = rs
		for id, r := range rs {
			runs[id] = r
		}

		// 2. tokens: one owner per token, the grant's owner and run; start
		// order follows token order.
		execs := byKey[ks]
		ownerOf := map[int64]string{}
		minGrant := int64(-1)
		for tok := range grants {
			if minGrant < 0 || tok < minGrant {
				minGrant = tok
			}
		}
		for _, e := range execs {
			if o, ok := ownerOf[e.Token]; ok && o != e.Owner {
				violate("%s: token %d used by two owners, %s and %s: %s", ks, e.Token, o, e.Owner, e)
			}
			ownerOf[e.Token] = e.Owner
			g, ok := grants[e.Token]
			switch {
			case ok && (g.owner != e.Owner || g.runID != e.RunID):
				violate("%s: execution %s under token %d, granted to %s for run %s", ks, e, e.Token, g.owner, soakShortID(g.runID))
			case !ok && (!trimmed || e.Token > minGrant):
				violate("%s: execution under token %d, which history never granted: %s", ks, e.Token, e)
			}
		}
		// grantedFrom: when e's lease was granted (a millisecond early, for
		// the precision of Redis time); its start when history lost it.
		grantedFrom := func(e soakExec) int64 {
			if g, ok := grants[e.Token]; ok {
				return g.at - int64(time.Millisecond)
			}
			return e.Start
		}
		slices.SortFunc(execs, func(a, b soakExec) int { return cmp.Compare(a.Start, b.Start) })
		for i, x := range execs {
			for _, y := range execs[:i] {
				tol := int64(0)
				if x.Proc != y.Proc {
					tol = int64(soakCrossProcTol)
				}
				if y.Start+tol >= x.Start || x.Token >= y.Token || x.DeadAtStart {
					continue
				}
				if st.paused(x.Proc, grantedFrom(x), x.Start) {
					stats["stale start by a paused holder (fenced)"]++
					continue
				}
				violate("%s: execution with token %d started after one with token %d, with a live context: %s after %s",
					ks, x.Token, y.Token, x, y)
			}
		}
		// 3. no overlap, unless the earlier holder (lower token) lost its
		// lease and its context was cancelled before the later one started
		// (invariant 3), or its process was frozen (then fencing must have
		// stopped its writes: checked on the history).
		for i, a := range execs {
			for _, b := range execs[i+1:] {
				if b.Start >= a.End {
					break // sorted by start: the rest start after a ended
				}
				if a.Token == b.Token {
					if a.Owner == b.Owner && a.Proc == b.Proc {
						violate("%s: two stages of one grant overlap: %s and %s", ks, a, b)
					}
					continue // different owners: reported above
				}
				tol := int64(0)
				if a.Proc != b.Proc {
					tol = int64(soakCrossProcTol)
				}
				if b.Start+tol >= a.End {
					continue
				}
				early, late := a, b
				if b.Token < a.Token {
					early, late = b, a
				}
				if st.paused(early.Proc, grantedFrom(early), early.End) {
					stats["overlap with a paused holder (fenced)"]++
					continue
				}
				if early.DeadAtStart {
					// Entered with its context already cancelled (the engine
					// went on after a completion that landed just before
					// the lease expired): it did nothing.
					stats["overlap with an execution entered with a dead context"]++
					continue
				}
				if early.Lost && early.CtxDone != 0 && early.CtxDone <= late.Start+tol {
					stats["overlap with a holder stopping after lease loss"]++
					continue
				}
				violate("%s: executions overlap by %s; the earlier holder's context was not cancelled by lease loss before the later one started:\n    %s\n    %s",
					ks, time.Duration(a.End-b.Start), early, late)
			}
		}
		// 4. a completed stage is never executed again in its run, and was
		// completed by an execution that returned nil.
		for _, e := range execs {
			r := rs[e.RunID]
			if r == nil || !r.complete {
				continue
			}
			if tok, ok := r.doneTok[e.Stage]; ok && e.Token > tok {
				violate("%s: run %s stage %s executed again under token %d after it was done under token %d: %s",
					ks, soakShortID(e.RunID), e.Stage, e.Token, tok, e)
			}
			// Resumed mid-stage with the last cursor saved in it, and no
			// other (the engine hands the cursor to the first stage of an
			// attempt only; a later stage of the same grant starts fresh).
			if _, granted := grants[e.Token]; granted {
				want := r.expectCursor(e.Stage, e.Token)
				if e.Cursor != want {
					violate("%s: execution handed cursor %q, want %q: %s", ks, e.Cursor, want, e)
				}
			}
			if e.Cursor != "" {
				stats["executions resumed with a cursor"]++
			}
		}
		type execID struct {
			runID, stage, owner string
			token               int64
		}
		index := make(map[execID]soakExec, len(execs))
		for _, e := range execs {
			index[execID{e.RunID, e.Stage, e.Owner, e.Token}] = e
		}
		for _, r := range rs {
			if !r.complete {
				continue
			}
			for stage, tok := range r.doneTok {
				e, found := index[execID{r.id, stage, r.doneOwner[stage], tok}]
				if found && e.Outcome != "ok" {
					violate("%s: run %s stage %s recorded done, but its execution ended %s: %s", ks, soakShortID(r.id), stage, e.Outcome, e)
				}
				if !found {
					violate("%s: run %s stage %s recorded done under token %d by %s, with no such execution", ks, soakShortID(r.id), stage, tok, r.doneOwner[stage])
				}
			}
		}
	}

	// 1. accepted requests.
	st.loadMu.Lock()
	submits, cancels := slices.Clone(st.submits), slices.Clone(st.cancels)
	st.loadMu.Unlock()
	outcomes := map[Outcome]int{}
	cancelOut := map[CancelOutcome]int{}
	for _, c := range cancels {
		cancelOut[c.outcome]++
	}
	for _, s := range submits {
		outcomes[s.outcome]++
		switch s.outcome {
		case OutcomeStarted, OutcomeJoined, OutcomeQueued, OutcomeReplaced:
		default:
			continue
		}
		r := runs[s.runID]
		if r == nil {
			if !st.keyTrimmed(keyRuns[s.key.String()]) {
				violate("%s: %s request (%s) for run %s: the run is not in the history", s.key, s.outcome, s.source, soakShortID(s.runID))
			}
			continue
		}
		if r.ended == "" {
			violate("%s: %s request for run %s: the run never ended: %s", s.key, s.outcome, soakShortID(s.runID), strings.Join(r.events, " "))
			continue
		}
		// A queued follow-up (queue, or replace of a running run) is the
		// run that serves the request: it is in the history under the id
		// the answer named and ended too — done, failed, or cancelled
		// (also when a cancel dropped it before it started).
		if s.outcome == OutcomeQueued || s.outcome == OutcomeReplaced {
			f := runs[s.servedBy]
			switch {
			case s.servedBy == "":
				violate("%s: %s request on run %s: the answer names no run that serves it", s.key, s.outcome, soakShortID(s.runID))
			case f == nil:
				if !st.keyTrimmed(keyRuns[s.key.String()]) {
					violate("%s: %s request: the run %s that serves it is not in the history", s.key, s.outcome, soakShortID(s.servedBy))
				}
			case f.ended == "":
				violate("%s: %s request: the run %s that serves it never ended: %s", s.key, s.outcome, soakShortID(s.servedBy), strings.Join(f.events, " "))
			}
		}
	}

	// Summary.
	ended := 0
	for _, r := range runs {
		if r.ended != "" {
			ended++
			stats["runs "+r.ended]++
		}
	}
	inproc, lost, killed := 0, 0, 0
	for _, e := range all {
		if e.Proc == soakParent {
			inproc++
		}
		if e.Lost {
			lost++
		}
		if e.Killed {
			killed++
		}
		if e.DeadAtStart {
			stats["executions entered with a dead context ("+e.Outcome+")"]++
		}
		stats["behaviour "+e.Behaviour]++
	}
	t.Logf("soak summary (seed %d): %s of chaos, drained in %s; %d runs ended (%d runs seen); %d stage executions (%d in-process, %d in children; %d ended by lease loss, %d cut by SIGKILL)",
		st.seed, dur, drained.Round(time.Millisecond), ended, len(runs), len(all), inproc, len(all)-inproc, lost, killed)
	t.Logf("soak summary: %d child runners started, %d SIGKILLed, %d SIGSTOPped; %d in-process runner restarts (graceful; %d failed to start), %d partitions, %d slow links, %d stale holders (late fenced writes: %s); takeovers (recovered) %d, lease-lost %d, handed-back %d, retries scheduled %d, cancels %v",
		st.childStarts.Load(), st.kills.Load(), st.pauseN.Load(), st.restarts.Load(), st.startFailures.Load(), st.cutN.Load(), st.slowN.Load(), st.staleN.Load(), st.lateWrites, stats["ev recovered"], stats["ev lease-lost"], stats["ev handed-back"], stats["ev retry-scheduled"], cancelOut)
	t.Logf("soak summary: %d submits %v; final statuses %v; keys with trimmed history %d", len(submits), outcomes, finals, trimmedKeys)
	var extra []string
	for k, n := range stats {
		if !strings.HasPrefix(k, "ev ") {
			extra = append(extra, fmt.Sprintf("%s=%d", k, n))
		}
	}
	slices.Sort(extra)
	t.Logf("soak summary: %s", strings.Join(extra, ", "))
	if n := len(bad); n > 0 {
		const show = 40
		more := ""
		if n > show {
			more = fmt.Sprintf("\n... and %d more", n-show)
			bad = bad[:show]
		}
		t.Fatalf("seed %d: %d invariant violations:\n%s%s", st.seed, n, strings.Join(bad, "\n"), more)
	}
}

func (st *soakTest) keyTrimmed(rs map[string]*soakRun) bool {
	for _, r := range rs {
		if !r.complete {
			return true
		}
	}
	return false
}

// checkHistory checks one key's history (oldest first) for legal order per
// run (5), strictly increasing grant tokens (2) and at most one completion
// per stage and run, in stage order (4). It returns the runs and the grants
// by token.
func (st *soakTest) checkHistory(ks string, hist []Event, trimmed bool, violate func(string, ...any), stats map[string]int) (map[string]*soakRun, map[int64]soakGrant) {
	k, err := taskkey.Parse(ks)
	if err != nil {
		st.t.Fatal(err)
	}
	stages := soakStagesOf(k.Scope())
	runs := map[string]*soakRun{}
	grants := map[int64]soakGrant{}
	var lastTok int64
	var prev *Event
	for i := range hist {
		ev := hist[i]
		stats["ev "+ev.Event]++
		r := runs[ev.RunID]
		if r == nil {
			r = &soakRun{id: ev.RunID, doneTok: map[string]int64{}, doneOwner: map[string]string{},
				progress: map[string]int64{}, cursorOf: map[int64]map[string]int64{}}
			// A run begins with the request that created it, or — a
			// follow-up, created when the run before it ends — with the
			// queue or replace requests it serves, logged under its id as
			// they come.
			r.complete = ev.Event == "requested" && (ev.Outcome == string(OutcomeStarted) ||
				ev.Outcome == string(OutcomeQueued) || ev.Outcome == string(OutcomeReplaced))
			if !r.complete && !trimmed {
				violate("%s: run %s begins with %s(%s), not its creation or a request it serves", ks, soakShortID(ev.RunID), ev.Event, ev.Outcome)
			}
			runs[ev.RunID] = r
		}
		name := ev.Event
		if ev.Outcome != "" {
			name += "(" + ev.Outcome + ")"
		}
		if ev.Stage != "" {
			name += ":" + ev.Stage
		}
		if ev.FencingToken != 0 {
			name += "#" + strconv.FormatInt(ev.FencingToken, 10)
		}
		r.events = append(r.events, name)
		bad := func(why string) {
			violate("%s: run %s: %s at %s: %s", ks, soakShortID(r.id), why, name, strings.Join(r.events, " "))
		}
		if r.ended != "" && r.complete {
			bad("event after the run ended " + r.ended)
		}
		held := func() bool { return r.holding && ev.FencingToken == r.grantTok && ev.Owner == r.grantOwn }
		switch ev.Event {
		case "requested":
			if ev.Outcome == string(OutcomeStarted) && len(r.events) > 1 {
				bad("created twice")
			}
		case "joined", "skipped":
		case "started", "recovered":
			if ev.FencingToken <= lastTok {
				bad(fmt.Sprintf("grant token %d not above the previous grant's %d", ev.FencingToken, lastTok))
			}
			lastTok = ev.FencingToken
			grants[ev.FencingToken] = soakGrant{owner: ev.Owner, runID: ev.RunID, at: ev.At.UnixNano()}
			if r.complete && r.holding {
				bad("granted while the previous holder still held the run")
			}
			if ev.Event == "recovered" && (prev == nil || prev.Event != "lease-lost" || prev.RunID != ev.RunID) {
				bad("recovered without a lease-lost just before")
			}
			if r.complete && ev.Stage != stagesAt(stages, r.nDone) {
				bad(fmt.Sprintf("granted at stage %q with %d stages done", ev.Stage, r.nDone))
			}
			if r.complete {
				// The recovery decision (checkpoints.Decide): restart, skip
				// or resume at the first incomplete stage.
				_, cursor := r.progress[ev.Stage]
				want := "resume"
				switch {
				case r.nDone == 0 && !cursor:
					want = "restart"
				case r.nDone >= len(stages):
					want = "skip"
				}
				if ev.Outcome != want && (ev.Outcome != "" || ev.Event == "recovered" || want != "restart") {
					bad(fmt.Sprintf("recovery %q, want %q (%d stages done, cursor %v)", ev.Outcome, want, r.nDone, cursor))
				}
			}
			r.cursorOf[ev.FencingToken] = maps.Clone(r.progress)
			r.holding, r.grantTok, r.grantOwn = true, ev.FencingToken, ev.Owner
		case "stage":
			if r.complete && !held() {
				bad(fmt.Sprintf("stage done by %s#%d, not the holder %s#%d (holding %v)", ev.Owner, ev.FencingToken, r.grantOwn, r.grantTok, r.holding))
			}
			if tok, dup := r.doneTok[ev.Stage]; dup {
				bad(fmt.Sprintf("stage %s done twice (first under token %d)", ev.Stage, tok))
			}
			if r.complete && ev.Stage != stagesAt(stages, r.nDone) {
				bad(fmt.Sprintf("stage %s done out of order (%d done)", ev.Stage, r.nDone))
			}
			r.doneTok[ev.Stage], r.doneOwner[ev.Stage] = ev.FencingToken, ev.Owner
			delete(r.progress, ev.Stage)
			r.nDone++
		case "progress":
			if r.complete && !held() {
				bad("progress saved by a non-holder")
			}
			if r.complete && ev.Stage != stagesAt(stages, r.nDone) {
				bad(fmt.Sprintf("progress saved in stage %s with %d stages done", ev.Stage, r.nDone))
			}
			r.progress[ev.Stage] = ev.FencingToken
		case "retry-scheduled", "handed-back":
			if r.complete && !held() {
				bad("written by a non-holder")
			}
			r.holding = false
		case "lease-lost":
			if r.complete && (!r.holding || ev.FencingToken != r.grantTok) {
				bad(fmt.Sprintf("lease-lost of token %d; the holder was #%d (holding %v)", ev.FencingToken, r.grantTok, r.holding))
			}
			r.holding = false
		case "done", "failed", "cancelled":
			if ev.Event == "done" && r.complete {
				if !held() {
					bad("done by a non-holder")
				}
				if r.nDone != len(stages) {
					bad(fmt.Sprintf("done with %d of %d stages done", r.nDone, len(stages)))
				}
			}
			r.ended, r.holding = ev.Event, false
		default:
			bad("unexpected event")
		}
		prev = &hist[i]
	}
	return runs, grants
}

func stagesAt(stages []string, i int) string {
	if i < len(stages) {
		return stages[i]
	}
	return ""
}
