package groupcommit_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/groupcommit"
	"github.com/tasklease/tasklease/internal/redistest"
)

// pipeHook counts the pipelines a client sends and how many are in flight
// at once, records each pipeline's command names, and can hold pipelines
// before they reach Redis (hold) until release is closed.
type pipeHook struct {
	mu        sync.Mutex
	pipelines [][]string // command names per pipeline, in send order
	singles   []string   // commands sent outside pipelines
	hold      atomic.Bool
	release   chan struct{}
	held      atomic.Int64 // pipelines waiting in the hook
	inFlight  atomic.Int64
	maxFlight atomic.Int64
}

func newPipeHook() *pipeHook { return &pipeHook{release: make(chan struct{})} }

// names renders the pipelines sent so far: each one's command names joined
// by "+", pipelines separated by spaces.
func (h *pipeHook) names() string {
	var out []string
	for _, p := range h.snapshot() {
		out = append(out, strings.Join(p, "+"))
	}
	return strings.Join(out, " ")
}

func (h *pipeHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *pipeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.mu.Lock()
		h.singles = append(h.singles, cmd.Name())
		h.mu.Unlock()
		return next(ctx, cmd)
	}
}

func (h *pipeHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if connSetup(cmds) {
			return next(ctx, cmds)
		}
		n := h.inFlight.Add(1)
		defer h.inFlight.Add(-1)
		for {
			m := h.maxFlight.Load()
			if n <= m || h.maxFlight.CompareAndSwap(m, n) {
				break
			}
		}
		names := make([]string, len(cmds))
		for i, c := range cmds {
			names[i] = c.Name()
		}
		h.mu.Lock()
		h.pipelines = append(h.pipelines, names)
		h.mu.Unlock()
		if h.hold.Load() {
			h.held.Add(1)
			<-h.release
			h.held.Add(-1)
		}
		return next(ctx, cmds)
	}
}

// connSetup reports whether cmds are go-redis's own connection setup
// (HELLO, CLIENT SETINFO), sent as a pipeline when a connection is dialled.
func connSetup(cmds []redis.Cmder) bool {
	for _, c := range cmds {
		if n := c.Name(); n != "client" && n != "hello" && n != "auth" && n != "select" {
			return false
		}
	}
	return len(cmds) > 0
}

func (h *pipeHook) snapshot() [][]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([][]string, len(h.pipelines))
	copy(out, h.pipelines)
	return out
}

func (h *pipeHook) reset() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.pipelines, h.singles = nil, nil
	h.maxFlight.Store(0)
}

// waitFor polls cond until it holds or d passes.
func waitFor(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(time.Millisecond)
	}
}

// newHooked returns a client on a real redis-server with h installed and a
// group-commit Client on it.
func newHooked(t *testing.T, cfg groupcommit.Config) (*redis.Client, *groupcommit.Client, *pipeHook) {
	t.Helper()
	s := redistest.StartServer(t)
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr(), PoolSize: 16, DisableIdentity: true})
	t.Cleanup(func() { _ = rdb.Close() })
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	h := newPipeHook()
	rdb.AddHook(h)
	gc, err := groupcommit.New(rdb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return rdb, gc, h
}

// Many goroutines calling Do at once each get their own replies (and their
// own errors), the calls share pipelines, and no more than MaxInFlight
// pipelines are ever in flight.
func TestConcurrentCallsShareBoundedPipelines(t *testing.T) {
	const (
		callers     = 300
		maxInFlight = 2
		maxBatch    = 16
	)
	_, gc, h := newHooked(t, groupcommit.Config{MaxInFlight: maxInFlight, MaxBatch: maxBatch})
	ctx := context.Background()

	// Hold the first pipelines in the hook until every flusher is busy, so
	// the callers below queue up behind them.
	h.hold.Store(true)
	var warm sync.WaitGroup
	for i := range maxInFlight {
		warm.Add(1)
		go func() {
			defer warm.Done()
			cmd := redis.NewCmd(ctx, "echo", "warm"+strconv.Itoa(i))
			if err := gc.Do(ctx, cmd); err != nil || cmd.Val() != "warm"+strconv.Itoa(i) {
				t.Errorf("warm-up call %d: %v %v", i, cmd.Val(), err)
			}
		}()
		waitFor(t, 5*time.Second, "warm-up pipeline held", func() bool { return h.held.Load() == int64(i+1) })
	}

	var started, wg sync.WaitGroup
	started.Add(callers)
	errs := make(chan error, 3*callers) // at most 3 per caller: never blocks
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := "k" + strconv.Itoa(i)
			echo := redis.NewCmd(ctx, "echo", "v"+strconv.Itoa(i))
			incr := redis.NewIntCmd(ctx, "incrby", key, i+1)
			cmds := []redis.Cmder{echo, incr}
			var bad *redis.Cmd
			if i%7 == 0 { // a command that fails, in the middle of the pipeline
				bad = redis.NewCmd(ctx, "eval", "return redis.error_reply('E"+strconv.Itoa(i)+"')", 0)
				cmds = []redis.Cmder{echo, bad, incr}
			}
			started.Done()
			if err := gc.Do(ctx, cmds...); err != nil {
				errs <- fmt.Errorf("call %d: Do: %v", i, err)
				return
			}
			if v, err := echo.Text(); err != nil || v != "v"+strconv.Itoa(i) {
				errs <- fmt.Errorf("call %d: echo = %q, %v", i, v, err)
			}
			if v, err := incr.Result(); err != nil || v != int64(i+1) {
				errs <- fmt.Errorf("call %d: incrby = %d, %v; want %d", i, v, err, i+1)
			}
			if bad != nil {
				if err := bad.Err(); err == nil || !strings.Contains(err.Error(), "E"+strconv.Itoa(i)) {
					errs <- fmt.Errorf("call %d: failing command's error %v, want its own E%d", i, err, i)
				}
			}
		}()
	}
	started.Wait()
	h.hold.Store(false)
	close(h.release)
	wg.Wait()
	warm.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	pipes := h.snapshot()
	calls := callers + maxInFlight
	total := 0
	for i, p := range pipes {
		total += len(p)
		// MaxBatch bounds the calls of a pipeline (each of these has at
		// most 3 commands; see TestMaxBatchBoundsPipelines).
		if len(p) > 3*maxBatch {
			t.Errorf("pipeline %d has %d commands, more than MaxBatch %d calls can hold", i, len(p), maxBatch)
		}
	}
	wantCmds := maxInFlight + 2*callers + (callers+6)/7
	if total != wantCmds {
		t.Errorf("pipelines carried %d commands, want %d (each exactly once)", total, wantCmds)
	}
	if len(pipes) >= calls {
		t.Errorf("%d calls took %d pipelines; concurrent calls must share them", calls, len(pipes))
	}
	if m := h.maxFlight.Load(); m > maxInFlight {
		t.Errorf("%d pipelines in flight at once, MaxInFlight is %d", m, maxInFlight)
	} else if m < maxInFlight {
		t.Errorf("at most %d pipelines in flight; the warm-up held %d", m, maxInFlight)
	}
	t.Logf("%d calls, %d commands, %d pipelines, max %d in flight", calls, total, len(pipes), h.maxFlight.Load())
}

// No pipeline carries more than MaxBatch single-command calls, and queued
// calls fill pipelines up to it.
func TestMaxBatchBoundsPipelines(t *testing.T) {
	const (
		callers  = 100
		maxBatch = 8
	)
	_, gc, h := newHooked(t, groupcommit.Config{MaxInFlight: 1, MaxBatch: maxBatch})
	ctx := context.Background()
	h.hold.Store(true)
	var wg sync.WaitGroup
	call := func(i int) {
		defer wg.Done()
		c := redis.NewCmd(ctx, "echo", strconv.Itoa(i))
		if err := gc.Do(ctx, c); err != nil || c.Val() != strconv.Itoa(i) {
			t.Errorf("call %d: %v %v", i, c.Val(), err)
		}
	}
	wg.Add(1)
	go call(-1)
	waitFor(t, 5*time.Second, "first pipeline held", func() bool { return h.held.Load() == 1 })
	var started sync.WaitGroup
	started.Add(callers)
	for i := range callers {
		wg.Add(1)
		go func() {
			started.Done()
			call(i)
		}()
	}
	started.Wait()
	h.hold.Store(false)
	close(h.release)
	wg.Wait()
	pipes := h.snapshot()
	total, full := 0, 0
	for i, p := range pipes {
		total += len(p)
		if len(p) > maxBatch {
			t.Errorf("pipeline %d has %d calls, MaxBatch is %d", i, len(p), maxBatch)
		}
		if len(p) == maxBatch {
			full++
		}
	}
	if total != callers+1 || full == 0 {
		t.Errorf("%d pipelines carried %d calls (%d full), want %d calls and some full pipelines", len(pipes), total, full, callers+1)
	}
	t.Logf("%d calls in %d pipelines, %d of them full", total, len(pipes), full)
}

// A group of commands given to one Do call is sent in one pipeline, in order.
func TestDoKeepsACallsCommandsTogether(t *testing.T) {
	_, gc, h := newHooked(t, groupcommit.Config{})
	ctx := context.Background()
	set := redis.NewStatusCmd(ctx, "set", "a", "1")
	get := redis.NewStringCmd(ctx, "get", "a")
	del := redis.NewIntCmd(ctx, "del", "a")
	if err := gc.Do(ctx, set, get, del); err != nil {
		t.Fatal(err)
	}
	if set.Val() != "OK" || get.Val() != "1" || del.Val() != 1 {
		t.Fatalf("replies %q %q %d", set.Val(), get.Val(), del.Val())
	}
	pipes := h.snapshot()
	if len(pipes) != 1 || strings.Join(pipes[0], ",") != "set,get,del" {
		t.Fatalf("pipelines %v, want one [set get del]", pipes)
	}
}

// On an idle client a call is sent at once, alone: one pipeline of one
// command, observed by the hook before Do returns; sequential calls never
// wait for company (no timer), so they cost about what direct calls cost.
func TestIdleCallIsSentAtOnce(t *testing.T) {
	rdb, gc, h := newHooked(t, groupcommit.Config{})
	ctx := context.Background()
	cmd := redis.NewCmd(ctx, "echo", "x")
	if err := gc.Do(ctx, cmd); err != nil || cmd.Val() != "x" {
		t.Fatalf("Do: %v %v", cmd.Val(), err)
	}
	if pipes := h.snapshot(); len(pipes) != 1 || len(pipes[0]) != 1 || pipes[0][0] != "echo" {
		t.Fatalf("pipelines %v, want exactly one pipeline of one echo", pipes)
	}

	// Sequential calls: one pipeline each, and no added wait. A timer that
	// waits for more calls (even 1ms) would make 200 sequential calls take
	// 200ms more than direct ones; allow generous noise for a busy machine.
	const n = 200
	h.reset()
	measure := func(f func(i int)) time.Duration {
		start := time.Now()
		for i := range n {
			f(i)
		}
		return time.Since(start)
	}
	var direct, grouped time.Duration
	for range 3 { // interleave to share whatever the machine does meanwhile
		direct += measure(func(int) { rdb.Echo(ctx, "d") })
		grouped += measure(func(i int) {
			c := redis.NewCmd(ctx, "echo", "g")
			if err := gc.Do(ctx, c); err != nil || c.Val() != "g" {
				t.Fatalf("call %d: %v %v", i, c.Val(), err)
			}
		})
	}
	pipes := h.snapshot()
	if len(pipes) != 3*n {
		t.Errorf("%d sequential calls took %d pipelines, want one each", 3*n, len(pipes))
	}
	for i, p := range pipes {
		if len(p) != 1 {
			t.Fatalf("sequential pipeline %d has %v", i, p)
		}
	}
	t.Logf("%d sequential calls: direct %s, grouped %s", 3*n, direct, grouped)
	if grouped > 4*direct+300*time.Millisecond {
		t.Errorf("sequential grouped calls took %s, direct %s: an idle call must not wait", grouped, direct)
	}
}

// A call whose context ends while its pipeline is held returns the
// context's cause; Eval's command carries it too. An already-ended context
// returns its cause at once.
func TestContextEndReturnsCause(t *testing.T) {
	_, gc, h := newHooked(t, groupcommit.Config{MaxInFlight: 1})
	h.hold.Store(true)
	defer func() {
		h.hold.Store(false)
		close(h.release)
	}()

	cause := errors.New("caller gave up")
	ctx, cancel := context.WithCancelCause(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- gc.Do(ctx, redis.NewCmd(ctx, "echo", "held")) }()
	waitFor(t, 5*time.Second, "pipeline held", func() bool { return h.held.Load() == 1 })
	cancel(cause)
	select {
	case err := <-errc:
		if !errors.Is(err, cause) {
			t.Fatalf("Do = %v, want the cause %v", err, cause)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Do did not return when its context ended")
	}

	// Queued behind the held pipeline (MaxInFlight 1): Eval returns the
	// deadline's cause.
	dctx, dcancel := context.WithTimeoutCause(context.Background(), 20*time.Millisecond, cause)
	defer dcancel()
	if err := gc.Eval(dctx, "return 1", nil).Err(); !errors.Is(err, cause) {
		t.Fatalf("Eval = %v, want the cause %v", err, cause)
	}

	done, dn := context.WithCancelCause(context.Background())
	dn(cause)
	if err := gc.Do(done, redis.NewCmd(done, "echo", "late")); !errors.Is(err, cause) {
		t.Fatalf("Do with an ended context = %v, want the cause", err)
	}
}

// The Cmd an Eval returns with its context's cause does not change when
// the pipeline it was in is answered later (the pipeline writes another
// Cmd): an Eval that failed never turns into a success, and the caller's
// reads do not race with the flush (go test -race).
func TestEvalCmdUntouchedAfterContextEnd(t *testing.T) {
	_, gc, h := newHooked(t, groupcommit.Config{MaxInFlight: 1})
	h.hold.Store(true)
	cause := errors.New("caller gave up")
	ctx, cancel := context.WithCancelCause(context.Background())
	res := make(chan *redis.Cmd, 1)
	go func() { res <- gc.Eval(ctx, "return 'ran'", nil) }()
	waitFor(t, 5*time.Second, "pipeline held", func() bool { return h.held.Load() == 1 })
	cancel(cause)
	cmd := <-res
	if !errors.Is(cmd.Err(), cause) {
		t.Fatalf("Eval = %v, want the cause", cmd.Err())
	}
	h.hold.Store(false)
	close(h.release)
	waitFor(t, 5*time.Second, "held pipeline done", func() bool { return h.inFlight.Load() == 0 })
	if !errors.Is(cmd.Err(), cause) || cmd.Val() != nil {
		t.Fatalf("after Eval returned the cause, its command changed to %v, %v", cmd.Val(), cmd.Err())
	}
}

// (*redis.Script).Run through the Client: EVALSHA first; after SCRIPT FLUSH
// the NOSCRIPT answer makes it fall back to EVAL, which works and loads the
// script again. Keys and arguments reach the script in order.
func TestScriptRunFallsBackToEvalAfterFlush(t *testing.T) {
	rdb, gc, h := newHooked(t, groupcommit.Config{})
	ctx := context.Background()
	script := redis.NewScript(`return {KEYS[1], KEYS[2], ARGV[1], ARGV[2], #KEYS, #ARGV}`)
	want := "[k1 k2 a1 2 2 2]"
	run := func(what string) {
		t.Helper()
		v, err := script.Run(ctx, gc, []string{"k1", "k2"}, "a1", 2).Result()
		if err != nil || fmt.Sprint(v) != want {
			t.Fatalf("%s: Run = %v, %v; want %s", what, v, err, want)
		}
	}

	run("first run")
	if got := h.names(); got != "evalsha eval" {
		t.Errorf("first run sent %q, want evalsha then eval", got)
	}
	h.reset()
	run("cached run")
	if got := h.names(); got != "evalsha" {
		t.Errorf("cached run sent %q, want evalsha only", got)
	}
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	h.reset()
	run("after SCRIPT FLUSH")
	if got := h.names(); got != "evalsha eval" {
		t.Errorf("after SCRIPT FLUSH sent %q, want evalsha (NOSCRIPT) then eval", got)
	}
	h.reset()
	run("after the fallback")
	if got := h.names(); got != "evalsha" {
		t.Errorf("after the fallback sent %q, want evalsha only (EVAL loaded it)", got)
	}

	// The read-only variants and Load/Exists go where they should.
	ro := redis.NewScript(`return ARGV[1]`)
	h.reset()
	if v, err := ro.RunRO(ctx, gc, nil, "ro").Result(); err != nil || v != "ro" {
		t.Fatalf("RunRO = %v, %v", v, err)
	}
	if got := h.names(); got != "evalsha_ro eval_ro" {
		t.Errorf("RunRO of a new script sent %q, want evalsha_ro then eval_ro", got)
	}
	if err := ro.Load(ctx, gc).Err(); err != nil {
		t.Fatal(err)
	}
	if ok, err := ro.Exists(ctx, gc).Result(); err != nil || len(ok) != 1 || !ok[0] {
		t.Fatalf("Exists = %v, %v", ok, err)
	}
	if v, err := gc.EvalShaRO(ctx, ro.Hash(), nil, "sro").Result(); err != nil || v != "sro" {
		t.Fatalf("EvalShaRO = %v, %v", v, err)
	}
	// A Do of a prepared EVALSHA command.
	c := gc.ScriptCmd(ctx, script.Hash(), []string{"x", "y"}, "z", 1)
	if err := gc.Do(ctx, c); err != nil || fmt.Sprint(c.Val()) != "[x y z 1 2 2]" {
		t.Fatalf("ScriptCmd via Do = %v, %v %v", c.Val(), c.Err(), err)
	}
}

// Errors of Redis reach the command, not Do (which only reports its
// context); a Client on a closed connection pool reports per command too.
func TestRedisErrorsArePerCommand(t *testing.T) {
	m := redistest.StartMini(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	gc, err := groupcommit.New(rdb, groupcommit.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ok := redis.NewStatusCmd(ctx, "set", "s", "x")
	bad := redis.NewIntCmd(ctx, "incr", "s")
	if err := gc.Do(ctx, ok, bad); err != nil {
		t.Fatal(err)
	}
	// ok ran before bad in the same pipeline; bad's error is its own.
	if ok.Err() != nil || bad.Err() == nil {
		t.Fatalf("set err %v, incr err %v; want nil and an error", ok.Err(), bad.Err())
	}
	m.Close()
	lost := redis.NewCmd(ctx, "echo", "x")
	if err := gc.Do(ctx, lost); err != nil {
		t.Fatalf("Do = %v; a Redis failure belongs to the command", err)
	}
	if lost.Err() == nil {
		t.Fatal("echo on a closed server has no error")
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	m := redistest.StartMini(t)
	rdb := m.Client(t)
	for _, tc := range []struct {
		name string
		rdb  redis.UniversalClient
		cfg  groupcommit.Config
	}{
		{"nil client", nil, groupcommit.Config{}},
		{"negative MaxInFlight", rdb, groupcommit.Config{MaxInFlight: -1}},
		{"negative MaxBatch", rdb, groupcommit.Config{MaxBatch: -5}},
	} {
		gc, err := groupcommit.New(tc.rdb, tc.cfg)
		if !errors.Is(err, groupcommit.ErrConfig) || gc != nil {
			t.Errorf("%s: New = %v, %v; want nil and ErrConfig", tc.name, gc, err)
		}
	}
	// Zero values take the defaults and work.
	gc, err := groupcommit.New(rdb, groupcommit.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if v, err := gc.Eval(context.Background(), "return ARGV[1]", nil, "d").Result(); err != nil || v != "d" {
		t.Fatalf("Eval with defaults = %v, %v", v, err)
	}
}
