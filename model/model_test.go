// Package model holds the Spin model of a key's run (run.pml) and the
// tests that check it and tie it to the code (docs/correctness.md#the-model).
package model

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/checkpoints"
	"github.com/tasklease/tasklease/fence"
	"github.com/tasklease/tasklease/internal/keyspace"
	"github.com/tasklease/tasklease/jobs"
	"github.com/tasklease/tasklease/leasing"
	"github.com/tasklease/tasklease/taskkey"
)

// requireTools returns the paths of spin and gcc. Without them the test
// skips, unless TASKLEASE_REQUIRE_SPIN=1 (as .ci/run sets): then it fails.
func requireTools(t *testing.T) (spin, gcc string) {
	t.Helper()
	var missing []string
	for _, name := range []string{"spin", "gcc"} {
		p, err := exec.LookPath(name)
		if err != nil {
			missing = append(missing, name)
		}
		if name == "spin" {
			spin = p
		} else {
			gcc = p
		}
	}
	if len(missing) > 0 {
		msg := fmt.Sprintf("%s not on PATH (apt-get install spin gcc)", strings.Join(missing, ", "))
		if os.Getenv("TASKLEASE_REQUIRE_SPIN") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return spin, gcc
}

// requests is the model's NSUB: how many requests of any policy it
// checks: 2 by default (a follow-up needs two; about 30 s of CPU), and
// TASKLEASE_MODEL_REQUESTS=3 takes about 7 minutes (docs/correctness.md).
func requests(t *testing.T) int {
	v := os.Getenv("TASKLEASE_MODEL_REQUESTS")
	if v == "" {
		return 2
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 2 || n > 4 {
		t.Fatalf("TASKLEASE_MODEL_REQUESTS=%q: want 2 to 4", v)
	}
	return n
}

// verdict is what pan said of one claim.
type verdict struct {
	errors, states int
	first          string // pan's line naming the first error
}

var (
	errorsRE = regexp.MustCompile(`errors: (\d+)`)
	statesRE = regexp.MustCompile(`(\d+) states, stored`)
)

// verify builds the model with defines and checks the LTL claim under
// weak fairness (pan -a -f), which checks the assertions too. An
// exhaustive search wants pan optimised (-O2); one that stops at its
// first error is quicker built without (-O0).
func verify(t *testing.T, spin, gcc, opt, claim string, defines ...string) verdict {
	t.Helper()
	dir := t.TempDir()
	src, err := os.ReadFile("run.pml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "run.pml"), src, 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(name string, args ...string) string {
		cmd := exec.Command(name, args...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	run(spin, append(defines, "-a", "run.pml")...)
	// NFAIR: weak fairness over the model's 8 processes. gcc's
	// stringop-overflow warning is a false alarm on pan's bounds-checked
	// arrays.
	run(gcc, opt, "-DNFAIR=3", "-Wno-stringop-overflow", "-o", "pan", "pan.c")
	out := run(filepath.Join(dir, "pan"), "-a", "-f", "-N", claim, "-m400000")
	var v verdict
	if m := errorsRE.FindStringSubmatch(out); m != nil {
		v.errors, _ = strconv.Atoi(m[1])
	} else {
		t.Fatalf("pan printed no error count:\n%s", out)
	}
	if m := statesRE.FindStringSubmatch(out); m != nil {
		v.states, _ = strconv.Atoi(m[1])
	}
	for l := range strings.Lines(out) {
		if strings.HasPrefix(l, "pan:1:") {
			v.first = strings.TrimSpace(l)
			break
		}
	}
	return v
}

// TestModelChecks checks both claims of the model exhaustively, with
// TASKLEASE_MODEL_CHECK=1 (.ci/run runs it alone: it takes a core for
// half a minute, which the -race suite around it would pay in flaky
// timings).
func TestModelChecks(t *testing.T) {
	spin, gcc := requireTools(t)
	if os.Getenv("TASKLEASE_MODEL_CHECK") != "1" {
		t.Skip("the exhaustive check: TASKLEASE_MODEL_CHECK=1 go test -run TestModelChecks -v ./model (TestModelCatchesMistakes runs always)")
	}
	nsub := fmt.Sprintf("-DNSUB=%d", requests(t))
	for _, claim := range []string{"ends", "followups"} {
		v := verify(t, spin, gcc, "-O2", claim, nsub)
		if v.errors != 0 {
			t.Errorf("claim %s: %d errors: %s", claim, v.errors, v.first)
		}
		t.Logf("claim %s, %s: %d states, no error", claim, nsub, v.states)
	}
}

// TestModelCatchesMistakes: each mistake the BROKEN_* flags make is found
// by the claim that should find it (a check that cannot fail proves
// nothing). Each search stops at its first error, in seconds.
func TestModelCatchesMistakes(t *testing.T) {
	spin, gcc := requireTools(t)
	nsub := fmt.Sprintf("-DNSUB=%d", requests(t))
	broken := []struct{ flag, claim, want string }{
		{"BROKEN_UNFENCED_DOWNSTREAM", "ends", "assertion violated"},
		{"BROKEN_UNFENCED_ADVANCE", "ends", "assertion violated"},
		{"BROKEN_NO_RECLAIM", "ends", "acceptance cycle"},
		{"BROKEN_LOSE_FOLLOWUP", "followups", "acceptance cycle"},
	}
	for _, b := range broken {
		v := verify(t, spin, gcc, "-O0", b.claim, nsub, "-D"+b.flag)
		if v.errors == 0 || !strings.Contains(v.first, b.want) {
			t.Errorf("%s: claim %s found %d errors (%q), want an %s", b.flag, b.claim, v.errors, v.first, b.want)
		}
	}
}

// simulate runs steps through the model (spin -DSCRIPT) and returns the
// state it printed after each.
func simulate(t *testing.T, spin string, steps []string) []map[string]string {
	t.Helper()
	dir := t.TempDir()
	src, err := os.ReadFile("run.pml")
	if err != nil {
		t.Fatal(err)
	}
	script := strings.Join(steps, "; report();\n") + "; report()\n"
	for name, body := range map[string][]byte{"run.pml": src, "script.pml": []byte(script)} {
		if err := os.WriteFile(filepath.Join(dir, name), body, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(spin, "-DSCRIPT", "run.pml")
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("spin -DSCRIPT: %v\n%s", err, out)
	}
	var states []map[string]string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 || f[0] != "STATE" {
			continue
		}
		st := map[string]string{}
		for _, kv := range f[1:] {
			k, v, _ := strings.Cut(kv, "=")
			st[k] = v
		}
		states = append(states, st)
	}
	if len(states) != len(steps) {
		t.Fatalf("the model printed %d states for %d steps:\n%s", len(states), len(steps), out)
	}
	return states
}

// compare checks that after every step the code's state has the model's
// values for the fields the code can show.
func compare(t *testing.T, steps []string, model, code []map[string]string) {
	t.Helper()
	for i := range steps {
		for k, v := range code[i] {
			if model[i][k] != v {
				t.Errorf("after step %d %s: %s is %s in the code, %s in the model\nmodel: %v\ncode:  %v",
					i+1, steps[i], k, v, model[i][k], model[i], code[i])
			}
		}
	}
}

// ranks numbers distinct values in the order they first appear (tokens,
// run ids), as the model counts them.
type ranks map[string]int

func (r ranks) of(v string) string {
	if v == "" {
		return "0"
	}
	if _, ok := r[v]; !ok {
		r[v] = len(r) + 1
	}
	return strconv.Itoa(r[v])
}

// leaseWorld runs the model's lease steps on the real scripts: leasing
// (grant, release), checkpoints (begin, fenced advance), the fencing
// downstream (fence.RedisStore), with Redis time driven by miniredis.
type leaseWorld struct {
	ctx    context.Context
	mr     *miniredis.Miniredis
	rdb    *redis.Client
	leases *leasing.Manager
	store  *checkpoints.Store
	down   fence.RedisStore
	ks     *keyspace.Space
	key    taskkey.Key
	held   map[int]leasing.Lease
	stage  map[int]int
	tokens ranks
	last   string // the rank of the last grant
}

const (
	modelTTL   = time.Second
	modelRunID = "run-1"
)

var modelStages = []string{"pulling", "pushing"} // NS = 2

func newLeaseWorld(t *testing.T) *leaseWorld {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	m, err := leasing.NewManager(rdb, leasing.Config{})
	if err != nil {
		t.Fatal(err)
	}
	st, err := checkpoints.NewStore(rdb, checkpoints.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ks, err := keyspace.New("", 0)
	if err != nil {
		t.Fatal(err)
	}
	return &leaseWorld{ctx: context.Background(), mr: mr, rdb: rdb, leases: m, store: st, down: fence.RedisStore{Client: rdb},
		ks: ks, key: taskkey.MustNew("u1", "sync"), held: map[int]leasing.Lease{}, stage: map[int]int{}, tokens: ranks{}, last: "0"}
}

var stepRE = regexp.MustCompile(`^(\w+)\((\w*)\)$`)

// do runs one step and returns what it answered, in the model's words.
func (w *leaseWorld) do(t *testing.T, step string) string {
	t.Helper()
	m := stepRE.FindStringSubmatch(step)
	if m == nil {
		t.Fatalf("step %q", step)
	}
	me, _ := strconv.Atoi(m[2])
	lease := w.held[me]
	switch m[1] {
	case "submit": // the run record is the registry's (TestModelMatchesRegistry)
		return "STARTED"
	case "claim":
		l, err := w.leases.Acquire(w.ctx, w.key, fmt.Sprintf("r%d", me), modelTTL)
		if errors.Is(err, leasing.ErrHeld) {
			return "BUSY"
		} else if err != nil {
			t.Fatal(err)
		}
		cp, err := w.store.Begin(w.ctx, l, modelRunID, modelStages)
		if err != nil {
			t.Fatal(err)
		}
		w.held[me], w.stage[me] = l, cp.Completed
		w.last = w.tokens.of(strconv.FormatInt(l.Token, 10))
		return "GRANTED"
	case "write":
		err := w.down.Guard(w.ctx, "downstream", lease.Token, func(context.Context) error { return nil })
		if errors.Is(err, fence.ErrStale) {
			return "REFUSED"
		} else if err != nil {
			t.Fatal(err)
		}
		return "ACCEPTED"
	case "advance":
		_, err := w.store.Advance(w.ctx, lease, modelRunID, modelStages[w.stage[me]])
		if errors.Is(err, leasing.ErrNotHeld) {
			return "LOST"
		} else if err != nil {
			t.Fatal(err)
		}
		w.stage[me]++
		return "OK"
	case "finish":
		err := w.leases.Release(w.ctx, lease)
		if errors.Is(err, leasing.ErrNotHeld) {
			return "LOST"
		} else if err != nil {
			t.Fatal(err)
		}
		return "OK"
	case "expire":
		w.mr.FastForward(modelTTL + time.Millisecond)
		return "OK"
	}
	t.Fatalf("step %q: not a lease step", step)
	return ""
}

// state is what the code shows of the model's variables.
func (w *leaseWorld) state(t *testing.T) map[string]string {
	t.Helper()
	holder := "0"
	if v, err := w.rdb.Get(w.ctx, w.ks.Lease(w.key)).Result(); err == nil {
		_, owner, _ := strings.Cut(v, "|")
		holder = strings.TrimPrefix(owner, "r")
	} else if !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	completed := 0
	if cp, err := w.store.Load(w.ctx, w.key); err == nil && cp != nil {
		completed = cp.Completed
	} else if err != nil && !errors.Is(err, checkpoints.ErrNotFound) {
		t.Fatal(err)
	}
	return map[string]string{"holder": holder, "tok": w.last, "completed": strconv.Itoa(completed)}
}

// TestModelMatchesLeases: interleavings of two runners' grants, stage
// writes, fenced advances and releases, with the lease expiring under the
// first, give the same answers and states in the model and on the real
// scripts.
func TestModelMatchesLeases(t *testing.T) {
	spin, _ := requireTools(t)
	scripts := map[string][]string{
		"takeover resumes, the stale holder is refused": {"submit(JOIN)", "claim(1)", "write(1)", "advance(1)", "expire()",
			"claim(2)", "write(1)", "write(2)", "write(1)", "advance(1)", "advance(2)", "write(2)", "finish(1)", "finish(2)"},
		"a live lease is not granted twice": {"submit(JOIN)", "claim(1)", "claim(2)", "write(1)", "advance(1)", "advance(2)",
			"advance(1)", "finish(2)", "finish(1)"},
		"expired before its first write": {"submit(JOIN)", "claim(1)", "expire()", "claim(2)", "write(2)", "write(1)",
			"advance(1)", "advance(2)", "finish(1)", "advance(2)", "finish(2)"},
	}
	for name, steps := range scripts {
		t.Run(name, func(t *testing.T) {
			model := simulate(t, spin, steps)
			w := newLeaseWorld(t)
			var code []map[string]string
			for _, s := range steps {
				said := w.do(t, s)
				st := w.state(t)
				st["said"] = said
				code = append(code, st)
			}
			compare(t, steps, model, code)
		})
	}
}

var noop = jobs.HandlerFunc(func(context.Context, *jobs.Run) error { return nil })

// TestModelMatchesRegistry: requests of every policy and cancels, on a
// key no runner serves, give the same answers, statuses and follow-ups in
// the model and through jobs.Registry (submit.lua, cancel.lua).
func TestModelMatchesRegistry(t *testing.T) {
	spin, _ := requireTools(t)
	scripts := map[string][]string{
		"policies on a queued run": {"submit(JOIN)", "submit(JOIN)", "submit(SKIP)", "submit(QUEUE)", "submit(QUEUE)",
			"submit(REPLACE)", "cancelRun()", "submit(SKIP)", "cancelRun()"},
		"a follow-up outlives a cancel": {"submit(QUEUE)", "submit(QUEUE)", "cancelRun()", "cancelRun()", "cancelRun()", "submit(REPLACE)"},
	}
	policies := map[string]jobs.Policy{"JOIN": jobs.PolicyJoin, "SKIP": jobs.PolicySkip, "QUEUE": jobs.PolicyQueue, "REPLACE": jobs.PolicyReplace}
	outcomes := map[jobs.Outcome]string{jobs.OutcomeStarted: "STARTED", jobs.OutcomeJoined: "JOINED", jobs.OutcomeSkipped: "SKIPPED",
		jobs.OutcomeQueued: "FOLLOWUP", jobs.OutcomeReplaced: "REPLACED"}
	for name, steps := range scripts {
		t.Run(name, func(t *testing.T) {
			model := simulate(t, spin, steps)
			mr := miniredis.RunT(t)
			rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
			defer rdb.Close()
			reg, err := jobs.NewRegistry(rdb, jobs.Config{Jobs: []jobs.Job{{Scope: "sync", Stages: []jobs.Stage{
				{Name: "pulling", Handler: noop}, {Name: "pushing", Handler: noop}}}}})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			runs := ranks{}
			var code []map[string]string
			for _, s := range steps {
				m := stepRE.FindStringSubmatch(s)
				said := ""
				switch m[1] {
				case "submit":
					res, err := reg.Submit(ctx, "u1", "sync", jobs.SubmitOptions{Source: jobs.SourceManual, Policy: policies[m[2]]})
					if err != nil {
						t.Fatal(err)
					}
					said = outcomes[res.Outcome]
				case "cancelRun":
					out, err := reg.Cancel(ctx, "u1", "sync")
					if err != nil {
						t.Fatal(err)
					}
					said = map[bool]string{true: "NONE", false: "OK"}[out == jobs.CancelNotRunning]
				}
				v, err := reg.Get(ctx, "u1", "sync")
				if err != nil {
					t.Fatal(err)
				}
				code = append(code, map[string]string{"said": said, "status": strings.ToUpper(string(v.Status)),
					"run": runs.of(v.RunID), "followUp": map[bool]string{true: "1", false: "0"}[v.FollowUpQueued]})
			}
			compare(t, steps, model, code)
		})
	}
}
