package triggers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/keyspace"
	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/jobs"
	"github.com/tasklease/tasklease/taskkey"
)

// subjectsN returns n subjects named prefix0000, prefix0001, ...
func subjectsN(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%04d", prefix, i)
	}
	return out
}

// seedSubjects makes subjects part of scope's "subjects: all": each is
// requested once with source manual (a person pressed "sync").
func seedSubjects(t testing.TB, reg *jobs.Registry, scope string, subjects []string) {
	t.Helper()
	for i := 0; i < len(subjects); i += 500 {
		if _, err := reg.SubmitMany(context.Background(), scope, subjects[i:min(i+500, len(subjects))],
			jobs.SubmitManyOptions{Source: jobs.SourceManual}); err != nil {
			t.Fatal(err)
		}
	}
}

// checkExactlyOnce checks that occurrence at of schedule name reached each
// subject exactly once: one history event with source schedule (no other
// occurrence of the schedule fired in these tests), and the task record
// remembers the occurrence.
func checkExactlyOnce(t *testing.T, reg *jobs.Registry, rdb redis.UniversalClient, scope, name string, at time.Time, subjects []string) {
	t.Helper()
	ks, err := keyspace.New(testPrefix, reg.Partitions())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	pipe := rdb.Pipeline()
	occ := make([]*redis.StringCmd, len(subjects))
	for i, subj := range subjects {
		occ[i] = pipe.HGet(ctx, ks.Task(taskkey.MustNew(subj, scope)), "occ:"+name)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		t.Fatal(err)
	}
	bad := 0
	want := strconv.FormatInt(at.Unix(), 10)
	for i, subj := range subjects {
		n := scheduleRequests(t, reg, subj, scope)
		if v := occ[i].Val(); n != 1 || v != want {
			if bad++; bad <= 10 {
				t.Errorf("%s|%s: %d schedule requests, occ:%s = %q; want 1 and %s", subj, scope, n, name, v, want)
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d subjects did not get exactly one request", bad, len(subjects))
	}
}

// fanState reads a schedule's fan-out state hash.
func fanState(t testing.TB, rdb redis.UniversalClient, name string) map[string]string {
	t.Helper()
	h, err := rdb.HGetAll(context.Background(), stateKeyName(name)).Result()
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// faultHook makes chosen Redis calls fail: the nth SubmitMany pipeline
// (kind "submit"), cursor write ("progress") or subject page ("scan"),
// either before it is sent (nothing happens in Redis) or after it ran (the
// reply is lost).
type faultHook struct {
	mu       sync.Mutex
	faults   map[string]map[int]bool // kind → call number → after send
	calls    map[string]int
	injected int
}

var errInjected = errors.New("injected fault")

func newFaultHook() *faultHook {
	return &faultHook{faults: map[string]map[int]bool{}, calls: map[string]int{}}
}

func (h *faultHook) fail(kind string, n int, afterSend bool) {
	if h.faults[kind] == nil {
		h.faults[kind] = map[int]bool{}
	}
	h.faults[kind][n] = afterSend
}

func (h *faultHook) pending() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, m := range h.faults {
		n += len(m)
	}
	return n - h.injected
}

// decide counts a call of kind and says whether to fail it, and when.
func (h *faultHook) decide(kind string) (fail, afterSend bool) {
	if kind == "" {
		return false, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.calls[kind]++
	after, ok := h.faults[kind][h.calls[kind]]
	if ok {
		h.injected++
	}
	return ok, after
}

func kindOf(cmd redis.Cmder) string {
	a := cmd.Args()
	name := strings.ToLower(fmt.Sprint(a[0]))
	switch {
	case name == "zscan":
		return "scan"
	case name == "evalsha" && len(a) > 3 && fmt.Sprint(a[1]) == cronScripts().progress.Hash():
		return "progress"
	case (name == "evalsha" || name == "fcall") && len(a) > 3 && strings.HasSuffix(fmt.Sprint(a[3]), ":q:b"):
		return "submit"
	}
	return ""
}

func (h *faultHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (h *faultHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		fail, after := h.decide(kindOf(cmd))
		if !fail {
			return next(ctx, cmd)
		}
		if after {
			_ = next(ctx, cmd)
		}
		cmd.SetErr(errInjected)
		return errInjected
	}
}

func (h *faultHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		kind := ""
		for _, c := range cmds {
			if kind = kindOf(c); kind != "" {
				break
			}
		}
		fail, after := h.decide(kind)
		if !fail {
			return next(ctx, cmds)
		}
		if after {
			_ = next(ctx, cmds)
		}
		for _, c := range cmds {
			c.SetErr(errInjected)
		}
		return errInjected
	}
}

// TestFanOutSurvivesRedisErrors: Redis fails in the middle of a
// "subjects: all" fan-out — a page read, a submit that never reached
// Redis, a submit whose reply was lost after it ran, a cursor write lost
// after it ran, a cursor write that never ran. The fan-out retries each
// batch and finishes: every subject has exactly one schedule request for
// the occurrence; the re-sent batches were answered "duplicate".
func TestFanOutSurvivesRedisErrors(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	rdb := srv.Client(t)
	reg := newRegistry(t, rdb)
	subjects := subjectsN("e", 1000) // ~250 per partition: ZSCAN pages them
	seedSubjects(t, reg, "message_sync", subjects)

	sc := Schedule{Name: "errors", Cron: "@hourly", Scope: "message_sync", AllSubjects: true}
	s := newScheduler(t, rdb, reg, SchedulerConfig{ID: "solo", Schedules: []Schedule{sc}})
	var d decisions
	s.forceLeader, s.observe, s.batchSize, s.retryMin = true, d.add, 50, time.Millisecond
	if err := cronScripts().progress.Load(context.Background(), rdb).Err(); err != nil {
		t.Fatal(err)
	}
	h := newFaultHook()
	h.fail("scan", 2, false)
	h.fail("submit", 3, false)    // never reached Redis
	h.fail("progress", 4, true)   // recorded, reply lost
	h.fail("submit", 7, true)     // submitted, reply lost
	h.fail("progress", 9, false)  // never recorded
	h.fail("submit", 12, true)    // submitted, reply lost
	h.fail("progress", 14, false) // never recorded
	rdb.AddHook(h)

	occ := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	if got := s.fire(context.Background(), s.entries[0], occ); got != DecisionFired {
		t.Fatalf("fire = %s; want %s (%v)", got, DecisionFired, d.all)
	}
	if n := h.pending(); n != 0 {
		t.Fatalf("%d injected faults never happened (calls %v): the test did not exercise them", n, h.calls)
	}
	checkExactlyOnce(t, reg, rdb, sc.Scope, sc.Name, occ, subjects)
	st := fanState(t, rdb, sc.Name)
	f := d.all[len(d.all)-1]
	t.Logf("state %v; firing %+v", st, f)
	// Re-sent batches count once: a batch whose record failed counts its
	// subjects as submitted; only the subjects of a submit whose reply was
	// lost show up as duplicates (they were reached, unbeknown to the
	// fan-out). Together: every subject once.
	sub, dup := atoi(st["submitted"]), atoi(st["duplicates"])
	if dup == 0 || sub+dup != len(subjects) || sub != f.submitted || dup != f.duplicates {
		t.Errorf("recorded submitted %d + duplicates %d (fan-out: %d + %d); want a sum of %d with duplicates from the lost replies",
			sub, dup, f.submitted, f.duplicates, len(subjects))
	}
	if st["done"] != "1" {
		t.Errorf("fan-out not done: %v", st)
	}
	if got := s.fire(context.Background(), s.entries[0], occ); got != DecisionDuplicate {
		t.Errorf("second fire of the occurrence = %s", got)
	}
}

// TestLeaderKilledMidFanOut: the leader dies between submitting its third
// batch and recording it, and stays around as a zombie. The next leader
// adopts the fan-out under a newer term and finishes it from the saved
// cursor (re-sending the unrecorded batch, answered "duplicate"); the
// zombie's late cursor write is refused. Every subject gets exactly one
// request.
func TestLeaderKilledMidFanOut(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	const ttl = time.Second
	subjects := subjectsN("k", 100)
	sc := Schedule{Name: "killed", Cron: "@hourly", Scope: "course_sync", Subjects: subjects}
	occ := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return occ.Add(200 * time.Millisecond) }

	rdbA := srv.Client(t)
	regA := newRegistry(t, rdbA)
	a := newScheduler(t, rdbA, regA, SchedulerConfig{ID: "pod-a", Schedules: []Schedule{sc}, LeaderTTL: ttl})
	var da decisions
	stuck, release := make(chan struct{}), make(chan struct{})
	a.now, a.observe, a.batchSize, a.skipUnlock = clock, da.add, 10, true
	a.afterSubmit = func(b batchInfo) bool {
		if b.seq == 3 {
			close(stuck)
			select { // a zombie: it wakes up when the test says so
			case <-release:
			case <-time.After(30 * time.Second):
			}
		}
		return true
	}
	ctxA, crashA := context.WithCancel(context.Background())
	doneA := make(chan error, 1)
	go func() { doneA <- a.Run(ctxA) }()
	select {
	case <-stuck:
	case <-time.After(10 * time.Second):
		t.Fatal("leader A never reached its third batch")
	}
	crashA() // A's leadership dies with it (no unlock); its fan-out is frozen mid-batch
	waitFor(t, 2*time.Second, "A to stop leading", func() bool { return !a.IsLeader() })
	st := fanState(t, rdbA, sc.Name)
	if st["index"] != "20" || st["done"] != "0" || st["owner"] != a.Owner() {
		t.Fatalf("state after the crash: %v; want index 20, unfinished, owned by A", st)
	}
	termA := st["term"]

	rdbB := srv.Client(t)
	regB := newRegistry(t, rdbB)
	b := newScheduler(t, rdbB, regB, SchedulerConfig{ID: "pod-b", Schedules: []Schedule{sc}, LeaderTTL: ttl})
	var db decisions
	b.now, b.observe, b.batchSize = clock, db.add, 10
	start(t, b)
	waitFor(t, 5*time.Second, "B to resume and finish the fan-out", func() bool { return db.count(DecisionResumed) == 1 })
	st = fanState(t, rdbB, sc.Name)
	if st["done"] != "1" || st["owner"] != b.Owner() || st["term"] == termA || st["resumes"] != "1" {
		t.Fatalf("state after B: %v", st)
	}
	var resumed firing
	for _, f := range db.all {
		if f.decision == DecisionResumed {
			resumed = f
		}
	}
	if resumed.duplicates != 10 || resumed.submitted != 70 || !resumed.at.Equal(occ) {
		t.Errorf("B's resume: %+v; want 70 submitted and A's unrecorded batch of 10 answered duplicate", resumed)
	}
	waitFor(t, 5*time.Second, "B's catch-up of the same occurrence", func() bool { return db.count(DecisionDuplicate) >= 1 })

	close(release) // the zombie wakes up and tries to record its batch
	select {
	case <-doneA:
	case <-time.After(10 * time.Second):
		t.Fatal("A's Run did not return")
	}
	if da.count(DecisionFenced) != 1 {
		t.Fatalf("A's decisions %v; want its late cursor write fenced", da.all)
	}
	if after := fanState(t, rdbB, sc.Name); after["index"] != st["index"] || after["batches"] != st["batches"] ||
		after["term"] != st["term"] || after["done"] != "1" {
		t.Errorf("the zombie moved the state: %v, was %v", after, st)
	}
	checkExactlyOnce(t, regB, rdbB, sc.Scope, sc.Name, occ, subjects)
}

// TestFanOutAllSubjectsStreams: "subjects: all" over 5,000 subjects in
// four partitions gives each exactly one request, a batch never holds much
// more than FanOutBatch subjects (not a whole partition, let alone all),
// and schedule requests do not make subjects part of "all".
func TestFanOutAllSubjectsStreams(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	rdb := srv.Client(t)
	reg := newRegistry(t, rdb)
	subjects := subjectsN("a", 5000)
	seedSubjects(t, reg, "message_sync", subjects)
	// A subject only a schedule ever asked for is not one of "all".
	onlyCron := Schedule{Name: "only-cron", Cron: "@hourly", Scope: "message_sync", Subjects: []string{"cron-only"}}
	sc := Schedule{Name: "everyone", Cron: "@hourly", Scope: "message_sync", AllSubjects: true}
	s := newScheduler(t, rdb, reg, SchedulerConfig{ID: "solo", Schedules: []Schedule{onlyCron, sc}})
	var d decisions
	s.forceLeader, s.observe = true, d.add
	occ := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	if got := s.fire(context.Background(), s.entries[0], occ); got != DecisionFired {
		t.Fatalf("only-cron: %s", got)
	}
	start := time.Now()
	if got := s.fire(context.Background(), s.entries[1], occ); got != DecisionFired {
		t.Fatalf("fire = %s", got)
	}
	f := d.all[len(d.all)-1]
	t.Logf("%d subjects in %s: %+v", len(subjects), time.Since(start), f)
	perPartition := len(subjects) / reg.Partitions()
	if f.maxBatch > 2*FanOutBatch || f.maxBatch >= perPartition {
		t.Errorf("a batch held %d subjects (FanOutBatch %d, %d per partition): not streamed", f.maxBatch, FanOutBatch, perPartition)
	}
	if f.submitted != len(subjects) || f.duplicates != 0 {
		t.Errorf("submitted %d, duplicates %d; want %d, 0", f.submitted, f.duplicates, len(subjects))
	}
	checkExactlyOnce(t, reg, rdb, sc.Scope, sc.Name, occ, subjects)
	if n := scheduleRequests(t, reg, "cron-only", "message_sync"); n != 1 {
		t.Errorf("cron-only: %d schedule requests; want 1 (from its own schedule only)", n)
	}
}

// TestShutdownStopsAfterBatchAndSuccessorResumes: Run's context ends in
// the middle of a fan-out; the batch in flight is still recorded, the
// fan-out stops there (interrupted), and the next leader finishes it at
// once — here with a config whose list grew, so it restarts from the
// beginning and the subjects already reached answer "duplicate".
func TestShutdownStopsAfterBatchAndSuccessorResumes(t *testing.T) {
	t.Parallel()
	mr := redistest.StartMini(t)
	rdb := mr.Client(t)
	reg := newRegistry(t, rdb)
	occ := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return occ.Add(200 * time.Millisecond) }
	first := subjectsN("s", 60)
	sc := Schedule{Name: "shutdown", Cron: "@hourly", Scope: "course_sync", Subjects: first}

	s1 := newScheduler(t, rdb, reg, SchedulerConfig{ID: "one", Schedules: []Schedule{sc}})
	var d1 decisions
	ctx, cancel := context.WithCancel(context.Background())
	s1.forceLeader, s1.now, s1.observe, s1.batchSize = true, clock, d1.add, 10
	s1.afterSubmit = func(b batchInfo) bool {
		if b.seq == 2 {
			cancel() // SIGTERM while batch 2 is in flight
		}
		return true
	}
	if err := s1.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if d1.count(DecisionInterrupted) != 1 {
		t.Fatalf("decisions %v; want the fan-out interrupted", d1.all)
	}
	st := fanState(t, rdb, sc.Name)
	if st["index"] != "20" || st["batches"] != "2" || st["done"] != "0" {
		t.Fatalf("state after shutdown: %v; want batch 2 recorded and no more", st)
	}

	grown := append(subjectsN("s", 60), "late1", "late2")
	sc2 := sc
	sc2.Subjects = grown
	s2 := newScheduler(t, rdb, reg, SchedulerConfig{ID: "two", Schedules: []Schedule{sc2}})
	var d2 decisions
	s2.forceLeader, s2.now, s2.observe, s2.batchSize = true, clock, d2.add, 10
	start(t, s2)
	waitFor(t, 5*time.Second, "the successor to finish", func() bool { return d2.count(DecisionResumed) == 1 })
	waitFor(t, 5*time.Second, "the successor's catch-up", func() bool { return d2.count(DecisionDuplicate) == 1 })
	f := d2.all[0]
	if f.decision != DecisionResumed || f.duplicates != 20 || f.submitted != len(grown)-20 {
		t.Errorf("successor: %+v; want a restart answering the 20 reached subjects duplicate", f)
	}
	checkExactlyOnce(t, reg, rdb, sc.Scope, sc.Name, occ, grown)
}

// TestFanOutFence exercises the claim, adopt and cursor scripts directly:
// a deposed term can neither move the cursor nor claim; an occurrence is
// never claimed after a later one; a claim retried after a lost reply is
// recognised; an unfinished fan-out older than the resume bound is
// abandoned, which unblocks the next occurrence.
func TestFanOutFence(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			rdb := b.Client
			reg := newRegistry(t, rdb)
			sc := Schedule{Name: "fence", Cron: "@every 60s", Scope: "course_sync", Subjects: []string{"u1", "u2"}}
			s := newScheduler(t, rdb, reg, SchedulerConfig{ID: "f", Schedules: []Schedule{sc}})
			e := s.entries[0]
			key := []string{stateKeyName(sc.Name)}
			t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
			progress := func(term int64, at time.Time, index, last int) string {
				t.Helper()
				res, err := cronScripts().progress.Run(ctx, rdb, key, term, at.Unix(), 0, "0", index-1, 0, "0", index, 1, 0, last, int64(3600000)).Slice()
				if err != nil {
					t.Fatal(err)
				}
				return replyStrings(res)[0]
			}
			adopt := func(term int64, bound time.Duration) []string {
				t.Helper()
				res, err := cronScripts().adopt.Run(ctx, rdb, key, "o", term, e.spec, bound.Milliseconds()).Slice()
				if err != nil {
					t.Fatal(err)
				}
				return replyStrings(res)
			}
			claim := func(term int64, at time.Time, id string) claimKind {
				t.Helper()
				k, _, err := s.claim(ctx, e, at, term, id)
				if err != nil {
					t.Fatal(err)
				}
				return k
			}

			if k := claim(10, t0, "c1"); k != claimClaimed {
				t.Fatalf("claim = %s", k)
			}
			if k := claim(10, t0, "c1"); k != claimClaimed {
				t.Errorf("the same claim retried after a lost reply = %s; want claimed", k)
			}
			if k := claim(10, t0, "c2"); k != claimDuplicate {
				t.Errorf("another claim of the occurrence = %s; want duplicate", k)
			}
			if r := progress(10, t0, 1, 0); r != "ok" {
				t.Fatalf("progress = %s", r)
			}
			if r := progress(10, t0, 1, 0); r != "recorded" {
				t.Errorf("progress retried after a lost reply = %s; want recorded", r)
			}
			if r := adopt(20, time.Hour); r[0] != "adopted" || r[4] != "1" {
				t.Fatalf("adopt by a newer term = %v; want adopted at index 1", r)
			}
			if r := progress(10, t0, 2, 0); r != "fenced" {
				t.Errorf("progress by the deposed term = %s; want fenced", r)
			}
			if r := adopt(15, time.Hour); r[0] != "fenced" {
				t.Errorf("adopt by an older term = %v; want fenced", r)
			}
			if k := claim(15, t0.Add(time.Minute), "c3"); k != claimFenced {
				t.Errorf("claim by an older term = %s; want fenced", k)
			}
			if k := claim(30, t0.Add(time.Minute), "c4"); k != claimBusy {
				t.Errorf("claim while a fan-out is unfinished = %s; want busy", k)
			}
			if r := progress(20, t0, 2, 1); r != "ok" {
				t.Fatalf("final progress = %s", r)
			}
			if r := progress(20, t0, 2, 1); r != "done" {
				t.Errorf("final progress retried = %s; want done", r)
			}
			if r := adopt(30, time.Hour); r[0] != "done" {
				t.Errorf("adopt of a finished fan-out = %v", r)
			}
			if st := fanState(t, rdb, sc.Name); st["submitted"] != "2" || st["index"] != "2" || st["term"] != "20" {
				t.Errorf("state %v: the fenced write counted", st)
			}
			if k := claim(30, t0.Add(time.Minute), "c5"); k != claimClaimed {
				t.Fatalf("claim of the next occurrence = %s", k)
			}
			if k := claim(40, t0, "c6"); k != claimDuplicate {
				t.Errorf("claim of a fired occurrence = %s; want duplicate", k)
			}
			if k := claim(40, t0.Add(30*time.Second), "c6"); k != claimDuplicate {
				t.Errorf("claim of an earlier occurrence (no fired key) after a later one = %s; want duplicate", k)
			}
			// The unfinished fan-out of t0+1m is older than a tiny bound.
			b.Advance(2 * time.Second)
			if r := adopt(40, time.Second); r[0] != "abandoned" {
				t.Fatalf("adopt past the resume bound = %v; want abandoned", r)
			}
			if k := claim(40, t0.Add(2*time.Minute), "c7"); k != claimClaimed {
				t.Errorf("claim after an abandoned fan-out = %s; want claimed", k)
			}
		})
	}
}

// TestTermsOnlyGrow: a new term is above the previous one even when the
// counter was lost (it expires; Redis may lose data).
func TestTermsOnlyGrow(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			rdb := b.Client
			s := newScheduler(t, rdb, newRegistry(t, rdb), SchedulerConfig{ID: "t",
				Schedules: []Schedule{{Name: "t", Cron: "@hourly", Scope: "course_sync", Subjects: []string{"u1"}}}})
			ctx := context.Background()
			var last int64
			for i := range 5 {
				b.Advance(time.Millisecond) // Redis time moves on (miniredis: by hand)
				if i == 3 {
					if err := rdb.Del(ctx, testPrefix+":cron:term").Err(); err != nil {
						t.Fatal(err)
					}
				}
				term, err := s.newTerm(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if term <= last || term >= 1<<53 {
					t.Fatalf("term %d after %d", term, last)
				}
				last = term
			}
			if ttl := rdb.PTTL(ctx, testPrefix+":cron:term").Val(); ttl <= 0 || ttl > TermTTL {
				t.Errorf("term counter TTL %s", ttl)
			}
		})
	}
}

// TestStatus: Status reports each schedule's cron, scope, subjects, next
// occurrence, last occurrence with its fan-out progress, and the leader.
func TestStatus(t *testing.T) {
	t.Parallel()
	mr := redistest.StartMini(t)
	rdb := mr.Client(t)
	reg := newRegistry(t, rdb)
	seedSubjects(t, reg, "message_sync", []string{"m1", "m2"})
	occ := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	s := newScheduler(t, rdb, reg, SchedulerConfig{ID: "st", Schedules: []Schedule{
		{Name: "list", Cron: "@hourly", Scope: "course_sync", Subjects: []string{"u1", "u2", "u3"}},
		{Name: "all", Cron: "@every 30s", Scope: "message_sync", AllSubjects: true},
	}})
	s.forceLeader, s.now = true, func() time.Time { return occ.Add(time.Minute) }
	if d := s.fire(context.Background(), s.entries[0], occ); d != DecisionFired {
		t.Fatal(d)
	}
	if err := rdb.Set(context.Background(), testPrefix+":cron:leader", "pod-x/abc", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	st, err := s.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(st) != 2 {
		t.Fatalf("%d statuses", len(st))
	}
	l, a := st[0], st[1]
	if l.Name != "list" || l.Cron != "@hourly" || l.Scope != "course_sync" || l.Subjects != (SubjectsCount{Count: 3}) ||
		l.Leader != "pod-x/abc" || l.NextOccurrence == nil || !l.NextOccurrence.Equal(occ.Add(time.Hour)) {
		t.Errorf("list status %+v", l)
	}
	lo := l.LastOccurrence
	if lo == nil || !lo.Occurrence.Equal(occ) || !lo.Done || lo.Submitted != 3 || lo.Index != 3 || lo.Total != 3 ||
		lo.Owner != s.Owner() || lo.FinishedAt == nil || lo.StartedAt.IsZero() {
		t.Errorf("list last occurrence %+v", lo)
	}
	if !a.Subjects.All || a.LastOccurrence != nil || !a.NextOccurrence.Equal(occ.Add(90*time.Second)) {
		t.Errorf("all status %+v", a)
	}
	js, err := json.Marshal(st)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"subjects":3`, `"subjects":"all"`, `"lastOccurrence":{"occurrence":"2026-01-01T10:00:00Z"`, `"done":true`} {
		if !strings.Contains(string(js), want) {
			t.Errorf("JSON %s lacks %s", js, want)
		}
	}
	var back []ScheduleStatus
	if err := json.Unmarshal(js, &back); err != nil || back[1].Subjects != (SubjectsCount{All: true}) || back[0].Subjects.Count != 3 {
		t.Errorf("round trip: %v %+v", err, back)
	}
	if l.RecentOccurrences != nil {
		t.Errorf("recent occurrences before a second claim: %+v", l.RecentOccurrences)
	}

	// Each claim archives the state it replaces: the recent fan-outs are
	// the earlier occurrences, newest first, capped at recentFanOuts.
	for h := 1; h <= recentFanOuts+1; h++ {
		at := occ.Add(time.Duration(h) * time.Hour)
		s.now = func() time.Time { return at.Add(time.Minute) }
		if d := s.fire(context.Background(), s.entries[0], at); d != DecisionFired {
			t.Fatal(d)
		}
	}
	if st, err = s.Status(context.Background()); err != nil {
		t.Fatal(err)
	}
	last := occ.Add((recentFanOuts + 1) * time.Hour)
	rec := st[0].RecentOccurrences
	if !st[0].LastOccurrence.Occurrence.Equal(last) || len(rec) != recentFanOuts {
		t.Fatalf("last %v, %d recent; want %v and %d", st[0].LastOccurrence.Occurrence, len(rec), last, recentFanOuts)
	}
	for i, f := range rec {
		if want := last.Add(-time.Duration(i+1) * time.Hour); !f.Occurrence.Equal(want) || !f.Done || f.Submitted != 3 ||
			f.Total != 3 || f.FinishedAt == nil || f.FinishedAt.Before(f.StartedAt) || f.Owner != s.Owner() {
			t.Errorf("recent[%d] = %+v; want the finished fan-out of %v", i, f, want)
		}
	}
}

// TestFanOutOnCluster: on a 3-master Redis Cluster the claim, resume,
// cursor and term scripts work (every key of one schedule shares its hash
// tag: no CROSSSLOT), a "subjects: all" fan-out and a list fan-out reach
// every subject once, an interrupted one is resumed by a successor, and
// Status reads every schedule.
func TestFanOutOnCluster(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t)
	rdb := cl.Client(t)
	reg := newRegistry(t, rdb)
	subjects := subjectsN("c", 600)
	seedSubjects(t, reg, "message_sync", subjects)
	schedules := []Schedule{
		{Name: "cluster-all", Cron: "@hourly", Scope: "message_sync", AllSubjects: true},
		{Name: "cluster-list", Cron: "@hourly", Scope: "course_sync", Subjects: subjects[:300]},
	}
	occ := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return occ.Add(200 * time.Millisecond) }

	s1 := newScheduler(t, rdb, reg, SchedulerConfig{ID: "one", Schedules: schedules})
	s1.forceLeader, s1.now, s1.batchSize = true, clock, 50
	s1.afterSubmit = func(b batchInfo) bool { return b.seq < 3 } // "crash" after submitting batch 3
	for _, e := range s1.entries {
		if d := s1.fire(context.Background(), e, occ); d != DecisionInterrupted {
			t.Fatalf("%s: %s; want interrupted", e.Name, d)
		}
	}
	s2 := newScheduler(t, rdb, reg, SchedulerConfig{ID: "two", Schedules: schedules})
	var d decisions
	s2.forceLeader, s2.now, s2.observe, s2.batchSize = true, clock, d.add, 50
	start(t, s2)
	waitFor(t, 10*time.Second, "both fan-outs resumed", func() bool { return d.count(DecisionResumed) == 2 })
	checkExactlyOnce(t, reg, rdb, "message_sync", "cluster-all", occ, subjects)
	checkExactlyOnce(t, reg, rdb, "course_sync", "cluster-list", occ, subjects[:300])
	st, err := s2.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range st {
		if s.LastOccurrence == nil || !s.LastOccurrence.Done || s.LastOccurrence.Resumes != 1 {
			t.Errorf("%s: %+v", s.Name, s.LastOccurrence)
		}
	}
}
