package triggers

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/jobs"
	"github.com/tasklease/tasklease/taskkey"
)

// checkOnceEach checks that every fired occurrence of a schedule produced
// exactly one schedule request per subject: the requests counted in each
// key's history equal the number of fired keys.
func checkOnceEach(t *testing.T, reg *jobs.Registry, fired map[int64]string, scope string, subjects ...string) {
	t.Helper()
	for _, subj := range subjects {
		if got := scheduleRequests(t, reg, subj, scope); got != len(fired) {
			t.Errorf("%s|%s: %d schedule requests for %d fired occurrences %v", subj, scope, got, len(fired), sortedKeys(fired))
		}
	}
}

func sortedKeys(m map[int64]string) []int64 {
	out := make([]int64, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// TestThreeRunnersFireEachOccurrenceOnce: three schedulers (three runners)
// on one real Redis, an @every 1s schedule with two explicit subjects and a
// "subjects: all" one, for a few seconds of real time. Each occurrence
// produces exactly one schedule request per subject, occurrences are
// consecutive seconds, and never do two schedulers lead at once.
func TestThreeRunnersFireEachOccurrenceOnce(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	schedules := []Schedule{
		{Name: "course-every-second", Cron: "@every 1s", Scope: "course_sync", Subjects: []string{"u1", "u2"}},
		{Name: "messages-all", Cron: "@every 1s", Scope: "message_sync", AllSubjects: true},
	}
	var regs []*jobs.Registry
	var scheds []*Scheduler
	for _, id := range []string{"runner-a", "runner-b", "runner-c"} {
		rdb := srv.Client(t) // one client and registry per runner, as in production
		reg := newRegistry(t, rdb)
		regs = append(regs, reg)
		scheds = append(scheds, newScheduler(t, rdb, reg, SchedulerConfig{
			ID: id, Schedules: schedules, LeaderTTL: time.Second,
		}))
	}
	ctx := context.Background()
	allSubjects := []string{"m1", "m2", "m3"}
	for _, subj := range allSubjects { // subjects ever submitted for message_sync
		if _, err := regs[0].Submit(ctx, subj, "message_sync", jobs.SubmitOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var stops []func()
	for _, s := range scheds {
		stops = append(stops, start(t, s))
	}

	rdb := srv.Client(t)
	const want = 5
	deadline := time.Now().Add(12 * time.Second)
	lastCheck, samples, led := time.Time{}, 0, 0
	for {
		leaders := 0
		for _, s := range scheds {
			if s.IsLeader() {
				leaders++
			}
		}
		samples++
		if leaders > 1 {
			t.Fatalf("sample %d: %d schedulers lead at once", samples, leaders)
		}
		led += leaders
		if time.Since(lastCheck) > 100*time.Millisecond {
			lastCheck = time.Now()
			if len(firedKeys(t, rdb, "course-every-second")) >= want && len(firedKeys(t, rdb, "messages-all")) >= want {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %d occurrences of each schedule", want)
		}
		time.Sleep(time.Millisecond)
	}
	if led == 0 {
		t.Fatal("no scheduler ever led")
	}
	for _, stop := range stops { // Run returns after any fan-out in flight
		stop()
	}
	for _, s := range scheds {
		if s.IsLeader() {
			t.Errorf("%s still leads after Run returned", s.Owner())
		}
	}
	if v, err := rdb.Exists(ctx, testPrefix+":cron:leader").Result(); err != nil || v != 0 {
		t.Errorf("leader mutex left behind after graceful shutdown (exists=%d, err=%v)", v, err)
	}

	for _, sc := range schedules {
		fired := firedKeys(t, rdb, sc.Name)
		ts := sortedKeys(fired)
		t.Logf("%s: fired %v", sc.Name, ts)
		// A shutdown just after a claim interrupts that fan-out before its
		// first batch, by design: the next leader resumes it from its
		// cursor, and none runs here. Only the latest occurrence may be so.
		st, err := rdb.HMGet(ctx, stateKeyName(sc.Name), "occ", "done").Result()
		if err != nil {
			t.Fatal(err)
		}
		if st[1] == "0" {
			occ, _ := strconv.ParseInt(fmt.Sprint(st[0]), 10, 64)
			if occ != ts[len(ts)-1] {
				t.Errorf("%s: unfinished fan-out of %d, not of the latest occurrence %d", sc.Name, occ, ts[len(ts)-1])
			}
			t.Logf("%s: the fan-out of %d was interrupted by the shutdown; not counted", sc.Name, occ)
			delete(fired, occ)
		}
		for i := 1; i < len(ts); i++ {
			if ts[i] != ts[i-1]+1 {
				t.Errorf("%s: occurrences not consecutive seconds: %v", sc.Name, ts)
				break
			}
		}
		subjects := sc.Subjects
		if sc.AllSubjects {
			subjects = allSubjects
		}
		checkOnceEach(t, regs[1], fired, sc.Scope, subjects...)
		ttl, err := rdb.TTL(ctx, firedKeyName(sc.Name, ts[0])).Result()
		if err != nil || ttl <= 50*time.Minute || ttl > FiredKeyTTLMin {
			t.Errorf("%s: fired key TTL %s (err %v), want about %s", sc.Name, ttl, err, FiredKeyTTLMin)
		}
	}
	// The foreground-free backup job was never touched.
	if _, err := regs[0].Get(ctx, "u1", "backup"); !errors.Is(err, jobs.ErrNotFound) {
		t.Errorf("backup submitted: %v", err)
	}
}

// TestLeaderCrashTakeover: the leader dies without unlocking (a crash);
// another scheduler leads within about LeaderTTL + LeaderTTL/3, and the
// following occurrences are still fired, once each.
func TestLeaderCrashTakeover(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	const ttl = time.Second
	sched := Schedule{Name: "takeover", Cron: "@every 1s", Scope: "course_sync", Subjects: []string{"u1", "u2"}}
	var scheds []*Scheduler
	var stops []func()
	var reg *jobs.Registry
	for _, id := range []string{"pod-a", "pod-b", "pod-c"} {
		rdb := srv.Client(t)
		reg = newRegistry(t, rdb)
		s := newScheduler(t, rdb, reg, SchedulerConfig{ID: id, Schedules: []Schedule{sched}, LeaderTTL: ttl})
		s.skipUnlock = true // every stop below is a crash
		scheds = append(scheds, s)
		stops = append(stops, start(t, s))
	}
	rdb := srv.Client(t)
	leader := -1
	waitFor(t, 10*time.Second, "a leader and two fired occurrences", func() bool {
		for i, s := range scheds {
			if s.IsLeader() {
				leader = i
			}
		}
		return leader >= 0 && len(firedKeys(t, rdb, sched.Name)) >= 2
	})
	old := scheds[leader]
	if got, err := old.Leader(context.Background()); err != nil || got != old.Owner() {
		t.Fatalf("Leader() = %q, %v; want %q", got, err, old.Owner())
	}
	killedAt := time.Now()
	stops[leader]() // crash: Run returns without releasing the mutex
	if v, _ := rdb.Get(context.Background(), testPrefix+":cron:leader").Result(); v != old.Owner() {
		t.Fatalf("crashed leader's mutex = %q, want it left behind as %q", v, old.Owner())
	}

	var next *Scheduler
	waitFor(t, ttl+time.Second, "a new leader", func() bool {
		for i, s := range scheds {
			if i != leader && s.IsLeader() {
				next = s
				return true
			}
		}
		return false
	})
	tookOver := time.Now()
	t.Logf("%s took over from %s after %s", next.Owner(), old.Owner(), tookOver.Sub(killedAt))

	waitFor(t, 5*time.Second, "two occurrences fired by the new leader", func() bool {
		n := 0
		for ts, owner := range firedKeys(t, rdb, sched.Name) {
			if owner == next.Owner() && time.Unix(ts, 0).After(tookOver) {
				n++
			}
		}
		return n >= 2
	})
	for _, stop := range stops {
		stop()
	}
	fired := firedKeys(t, rdb, sched.Name)
	t.Logf("fired: %v", fired)
	for ts, owner := range fired {
		if owner == old.Owner() && time.Unix(ts, 0).After(killedAt) {
			t.Errorf("occurrence %d fired by the crashed leader after its crash", ts)
		}
	}
	checkOnceEach(t, reg, fired, sched.Scope, sched.Subjects...)
}

// TestIdempotencyKeyWithTwoLeaders: two schedulers both forced to believe
// they lead (a paused leader waking up, a failover) claim the same
// occurrences; the fired key lets one submit, once per subject.
func TestIdempotencyKeyWithTwoLeaders(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			reg := newRegistry(t, b.Client)
			sc := Schedule{Name: "forced", Cron: "*/5 * * * *", Scope: "course_sync", Subjects: []string{"u1", "u2", "u3"}}
			var d decisions
			var scheds []*Scheduler
			for _, id := range []string{"x", "y"} {
				s := newScheduler(t, b.Client, reg, SchedulerConfig{ID: id, Schedules: []Schedule{sc}})
				s.forceLeader, s.observe = true, d.add
				scheds = append(scheds, s)
			}
			occ := time.Date(2026, 3, 1, 12, 5, 0, 0, time.UTC)
			var wg sync.WaitGroup
			for range 4 { // several goroutines per scheduler, all at once
				for _, s := range scheds {
					wg.Go(func() { s.fire(context.Background(), s.entries[0], occ) })
				}
			}
			wg.Wait()
			if f, dup := d.count(DecisionFired), d.count(DecisionDuplicate); f != 1 || dup != 7 {
				t.Fatalf("fired %d, duplicate %d; want 1 and 7", f, dup)
			}
			fired := firedKeys(t, b.Client, sc.Name)
			if len(fired) != 1 {
				t.Fatalf("fired keys %v", fired)
			}
			if _, ok := fired[occ.Unix()]; !ok {
				t.Fatalf("fired keys %v lack %d", fired, occ.Unix())
			}
			checkOnceEach(t, reg, fired, sc.Scope, sc.Subjects...)
		})
	}
}

// TestTwoForcedLeadersRealTime runs two forced leaders' Run loops on real
// time: both try every occurrence, each is fired once.
func TestTwoForcedLeadersRealTime(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	rdb := srv.Client(t)
	reg := newRegistry(t, rdb)
	sc := Schedule{Name: "forced-live", Cron: "@every 1s", Scope: "course_sync", Subjects: []string{"u1", "u2"}}
	var d decisions
	var stops []func()
	for _, id := range []string{"x", "y"} {
		s := newScheduler(t, rdb, reg, SchedulerConfig{ID: id, Schedules: []Schedule{sc}, LeaderTTL: time.Second})
		s.forceLeader, s.observe = true, d.add
		stops = append(stops, start(t, s))
	}
	waitFor(t, 8*time.Second, "three fired occurrences", func() bool { return d.count(DecisionFired) >= 3 })
	for _, stop := range stops {
		stop()
	}
	fired := firedKeys(t, rdb, sc.Name)
	// A fan-out ends once per occurrence: fired by its claimer, or resumed
	// by the other leader when it took over (the claimer is then fenced).
	if f := d.count(DecisionFired) + d.count(DecisionResumed); f != len(fired) {
		t.Errorf("%d fan-outs finished for %d occurrences: %v", f, len(fired), d.all)
	}
	// The other leader was refused: the occurrence was claimed, or its
	// term is older than the claimer's.
	if d.count(DecisionDuplicate)+d.count(DecisionFenced) == 0 {
		t.Errorf("the second leader never tried an occurrence: %v", d.all)
	}
	checkOnceEach(t, reg, fired, sc.Scope, sc.Subjects...)
}

// TestCatchUpOnLeadership: a runner that becomes leader fires the most
// recent occurrence within the catch-up window that has no fired key, and
// nothing older.
func TestCatchUpOnLeadership(t *testing.T) {
	t.Parallel()
	hourly := Schedule{Name: "hourly", Cron: "@hourly", Scope: "course_sync", Subjects: []string{"u1"}}
	occ := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)

	t.Run("missed occurrence in the gap is fired", func(t *testing.T) {
		mr := redistest.StartMini(t)
		rdb := mr.Client(t)
		reg := newRegistry(t, rdb)
		var d decisions
		s := newScheduler(t, rdb, reg, SchedulerConfig{ID: "a", Schedules: []Schedule{hourly}, LeaderTTL: time.Second})
		s.now = func() time.Time { return occ.Add(1200 * time.Millisecond) } // within LeaderTTL + TTL/3
		s.observe = d.add
		start(t, s)
		waitFor(t, 5*time.Second, "the catch-up firing", func() bool { return d.count(DecisionFired) == 1 })
		fired := firedKeys(t, rdb, hourly.Name)
		if fired[occ.Unix()] != s.Owner() || len(fired) != 1 {
			t.Fatalf("fired %v, want only %d by %s", fired, occ.Unix(), s.Owner())
		}
		checkOnceEach(t, reg, fired, hourly.Scope, hourly.Subjects...)
	})

	t.Run("occurrence already fired by the old leader", func(t *testing.T) {
		mr := redistest.StartMini(t)
		rdb := mr.Client(t)
		reg := newRegistry(t, rdb)
		if err := rdb.Set(context.Background(), firedKeyName("hourly", occ.Unix()), "old/leader", time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		var d decisions
		s := newScheduler(t, rdb, reg, SchedulerConfig{ID: "b", Schedules: []Schedule{hourly}, LeaderTTL: time.Second})
		s.now = func() time.Time { return occ.Add(500 * time.Millisecond) }
		s.observe = d.add
		start(t, s)
		waitFor(t, 5*time.Second, "the catch-up decision", func() bool { return d.count(DecisionDuplicate) == 1 })
		if n := scheduleRequests(t, reg, "u1", "course_sync"); n != 0 || d.count(DecisionFired) != 0 {
			t.Fatalf("%d requests, %d firings; want none", n, d.count(DecisionFired))
		}
	})

	t.Run("occurrence fired by a leader of the previous release", func(t *testing.T) {
		mr := redistest.StartMini(t)
		rdb := mr.Client(t)
		reg := newRegistry(t, rdb)
		legacy := testPrefix + ":cron:fired:hourly:" + strconv.FormatInt(occ.Unix(), 10)
		if err := rdb.Set(context.Background(), legacy, "old/release", time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
		var d decisions
		s := newScheduler(t, rdb, reg, SchedulerConfig{ID: "b", Schedules: []Schedule{hourly}, LeaderTTL: time.Second})
		s.now = func() time.Time { return occ.Add(500 * time.Millisecond) }
		s.observe = d.add
		start(t, s)
		waitFor(t, 5*time.Second, "the catch-up decision", func() bool { return d.count(DecisionDuplicate) == 1 })
		if n := scheduleRequests(t, reg, "u1", "course_sync"); n != 0 || d.count(DecisionFired) != 0 {
			t.Fatalf("%d requests, %d firings; want none", n, d.count(DecisionFired))
		}
	})

	t.Run("due rule", func(t *testing.T) {
		rdb := redistest.StartMini(t).Client(t)
		s := newScheduler(t, rdb, newRegistry(t, rdb),
			SchedulerConfig{ID: "c", Schedules: []Schedule{hourly, {Name: "sec", Cron: "@every 1s", Scope: "course_sync", Subjects: []string{"u1"}}}, LeaderTTL: 3 * time.Second})
		h, sec := s.entries[0], s.entries[1]
		cases := []struct {
			name      string
			e         *entry
			lastFired time.Time
			now       time.Time
			want      time.Time // zero: nothing due
		}{
			{"on time", h, time.Time{}, occ.Add(3 * time.Millisecond), occ},
			{"inside the window (TTL+TTL/3 = 4s)", h, time.Time{}, occ.Add(3900 * time.Millisecond), occ},
			{"older than the window", h, time.Time{}, occ.Add(4100 * time.Millisecond), time.Time{}},
			{"already fired", h, occ, occ.Add(time.Second), time.Time{}},
			{"just before", h, time.Time{}, occ.Add(-time.Millisecond), time.Time{}},
			{"most recent of several in the gap", sec, time.Time{}, occ.Add(2500 * time.Millisecond), occ.Add(2 * time.Second)},
			{"next after the last fired", sec, occ, occ.Add(1001 * time.Millisecond), occ.Add(time.Second)},
		}
		for _, c := range cases {
			got, ok := s.due(c.e, c.lastFired, c.now)
			if ok != !c.want.IsZero() || !got.Equal(c.want) {
				t.Errorf("%s: due = %v, %v; want %v", c.name, got, ok, c.want)
			}
		}
	})
}

// TestEveryIsEpochAnchored: "@every D" occurrences do not depend on when a
// runner started, so all runners agree on the idempotency keys.
func TestEveryIsEpochAnchored(t *testing.T) {
	sched, err := ParseCron("@every 30s")
	if err != nil {
		t.Fatal(err)
	}
	base := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	for _, start := range []time.Duration{0, 7 * time.Second, 29*time.Second + 999*time.Millisecond} {
		got := sched.Next(base.Add(start))
		if want := base.Add(30 * time.Second); !got.Equal(want) {
			t.Errorf("Next(+%s) = %v, want %v", start, got, want)
		}
	}
	if got := sched.Next(base.Add(30 * time.Second)); !got.Equal(base.Add(time.Minute)) {
		t.Errorf("Next is not strictly after an occurrence: %v", got)
	}
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err == nil {
		if got := sched.Next(base.In(berlin)); !got.Equal(base.Add(30 * time.Second)) {
			t.Errorf("Next depends on the location: %v", got)
		}
	}
}

func TestNewSchedulerValidation(t *testing.T) {
	mr := redistest.StartMini(t)
	rdb := mr.Client(t)
	reg := newRegistry(t, rdb)
	ok := Schedule{Name: "ok", Cron: "*/15 * * * *", Scope: "course_sync", Subjects: []string{"u1"}}
	with := func(f func(*Schedule)) []Schedule {
		s := ok
		f(&s)
		return []Schedule{s}
	}
	cases := []struct {
		name  string
		cfg   SchedulerConfig
		want  string
		is    error
		extra error
	}{
		{"bad cron", SchedulerConfig{Schedules: with(func(s *Schedule) { s.Cron = "61 * * * *" })}, "cron", jobs.ErrConfig, nil},
		{"seconds field not accepted", SchedulerConfig{Schedules: with(func(s *Schedule) { s.Cron = "0 */15 * * * *" })}, "cron", jobs.ErrConfig, nil},
		{"malformed TZ does not panic", SchedulerConfig{Schedules: with(func(s *Schedule) { s.Cron = "TZ=UTC" })}, "cron", jobs.ErrConfig, nil},
		{"sub-second every", SchedulerConfig{Schedules: with(func(s *Schedule) { s.Cron = "@every 1500ms" })}, "whole number of seconds", jobs.ErrConfig, nil},
		{"zero every", SchedulerConfig{Schedules: with(func(s *Schedule) { s.Cron = "@every 0s" })}, "whole number of seconds", jobs.ErrConfig, nil},
		{"never fires", SchedulerConfig{Schedules: with(func(s *Schedule) { s.Cron = "0 0 30 2 *" })}, "never fires", jobs.ErrConfig, nil},
		{"duplicate name", SchedulerConfig{Schedules: []Schedule{ok, ok}}, "duplicate name", jobs.ErrConfig, nil},
		{"bad name", SchedulerConfig{Schedules: with(func(s *Schedule) { s.Name = "a:b" })}, "name must match", jobs.ErrConfig, nil},
		{"empty name", SchedulerConfig{Schedules: with(func(s *Schedule) { s.Name = "" })}, "schedule #1", jobs.ErrConfig, nil},
		{"unknown scope", SchedulerConfig{Schedules: with(func(s *Schedule) { s.Scope = "nope" })}, "nope", jobs.ErrConfig, jobs.ErrUnknownScope},
		{"no subjects", SchedulerConfig{Schedules: with(func(s *Schedule) { s.Subjects = nil })}, "no subjects", jobs.ErrConfig, nil},
		{"subjects and all", SchedulerConfig{Schedules: with(func(s *Schedule) { s.AllSubjects = true })}, "not both", jobs.ErrConfig, nil},
		{"bad subject", SchedulerConfig{Schedules: with(func(s *Schedule) { s.Subjects = []string{"u 1"} })}, "subject", jobs.ErrConfig, taskkey.ErrInvalid},
		{"duplicate subject", SchedulerConfig{Schedules: with(func(s *Schedule) { s.Subjects = []string{"u1", "u1"} })}, "duplicate subject", jobs.ErrConfig, nil},
		{"leader TTL too short", SchedulerConfig{Schedules: []Schedule{ok}, LeaderTTL: 50 * time.Millisecond}, "leader TTL", jobs.ErrConfig, nil},
		{"negative leader TTL", SchedulerConfig{Schedules: []Schedule{ok}, LeaderTTL: -time.Second}, "leader TTL", jobs.ErrConfig, nil},
		{"bad prefix", SchedulerConfig{Schedules: []Schedule{ok}, Prefix: "{x}"}, "prefix", jobs.ErrConfig, nil},
		{"bad id", SchedulerConfig{Schedules: []Schedule{ok}, ID: "a|b"}, "id", jobs.ErrConfig, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := NewScheduler(rdb, reg, c.cfg)
			if err == nil {
				t.Fatal("want an error")
			}
			if !strings.Contains(err.Error(), c.want) || !errors.Is(err, c.is) || (c.extra != nil && !errors.Is(err, c.extra)) {
				t.Fatalf("err = %v; want it to mention %q and wrap %v %v", err, c.want, c.is, c.extra)
			}
		})
	}

	t.Run("every problem listed", func(t *testing.T) {
		_, err := NewScheduler(rdb, reg, SchedulerConfig{LeaderTTL: time.Millisecond, Schedules: []Schedule{
			{Name: "a", Cron: "nope", Scope: "course_sync", Subjects: []string{"u1"}},
			{Name: "b", Cron: "@hourly", Scope: "missing", AllSubjects: true},
		}})
		for _, want := range []string{"leader TTL", `schedule "a": cron`, `schedule "b"`, "missing"} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("err = %v; want it to mention %q", err, want)
			}
		}
	})

	t.Run("nil dependencies", func(t *testing.T) {
		if _, err := NewScheduler(nil, reg, SchedulerConfig{}); !errors.Is(err, jobs.ErrConfig) {
			t.Errorf("nil client: %v", err)
		}
		if _, err := NewScheduler(rdb, nil, SchedulerConfig{}); !errors.Is(err, jobs.ErrConfig) {
			t.Errorf("nil registry: %v", err)
		}
	})

	t.Run("valid", func(t *testing.T) {
		s, err := NewScheduler(rdb, reg, SchedulerConfig{ID: "pod-a", Logger: testLogger(), Schedules: []Schedule{
			ok,
			{Name: "all", Cron: "@every 30s", Scope: "message_sync", AllSubjects: true},
			{Name: "tz", Cron: "CRON_TZ=Europe/Berlin 0 3 * * *", Scope: "backup", Subjects: []string{"u1", "acct@example.com"}},
		}})
		if err != nil {
			t.Fatal(err)
		}
		if s.ttl != LeaderTTLDefault || s.renewEvery != LeaderTTLDefault/3 || s.loc != time.UTC || s.prefix != "tasklease" {
			t.Errorf("defaults: ttl %s renew %s loc %s prefix %s", s.ttl, s.renewEvery, s.loc, s.prefix)
		}
		if !strings.HasPrefix(s.Owner(), "pod-a/") || s.IsLeader() {
			t.Errorf("owner %q, leader %v", s.Owner(), s.IsLeader())
		}
		if err := s.Run(canceled()); err != nil {
			t.Errorf("Run: %v", err)
		}
		if err := s.Run(context.Background()); err == nil {
			t.Error("second Run succeeded")
		}
	})
}

func canceled() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// TestLeaderStepsDown: a leader whose extension is refused (the mutex was
// taken over) or cannot be confirmed (Redis hangs) stops leading before the
// mutex could be granted to anyone else, and leads again once it can.
func TestLeaderStepsDown(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	const ttl = 600 * time.Millisecond
	reg := newRegistry(t, rdb)
	s := newScheduler(t, rdb, reg, SchedulerConfig{ID: "solo", LeaderTTL: ttl,
		Schedules: []Schedule{{Name: "solo", Cron: "@hourly", Scope: "course_sync", Subjects: []string{"u1"}}}})
	start(t, s)
	waitFor(t, 5*time.Second, "leadership", s.IsLeader)

	// Taken over: another owner's value replaces ours.
	leaderKey := testPrefix + ":cron:leader"
	if err := rdb.Set(ctx, leaderKey, "intruder/1", 5*time.Second).Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ttl, "stepping down after a refused extension", func() bool { return !s.IsLeader() })
	if err := rdb.Del(ctx, leaderKey).Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*ttl, "leadership again", s.IsLeader)

	// Redis hangs: the extension cannot be confirmed; leadership ends no
	// later than the validity redsync computed, i.e. before the mutex
	// expires in Redis.
	srv.Pause()
	paused := time.Now()
	waitFor(t, ttl+100*time.Millisecond, "stepping down while Redis hangs", func() bool { return !s.IsLeader() })
	t.Logf("stepped down %s after Redis hung", time.Since(paused))
	srv.Resume()
	waitFor(t, 5*time.Second, "leadership after Redis came back", s.IsLeader)
}
