package jobs

// Compact, coalesced history (DESIGN §3, §9): a capped list of compact
// entries; of the requests that leave a run as it is (joined, skipped,
// queued, throttled) the first per (source, outcome) appends an event and
// repeats only count (record field c:<source>:<outcome>); History adds
// count and lastAt; when the key's next run starts the counts are folded
// into the list and the fields deleted.

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/checkpoints"
	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/taskkey"
)

const hsScope = "hist_sync"

// hsRepeat submits n requests of src with policy pol from a few goroutines
// at once (they share round trips, as real callers do) and checks each
// outcome.
func hsRepeat(t *testing.T, e *testEnv, subject string, src Source, pol Policy, n int, want Outcome) {
	t.Helper()
	const workers = 8
	var wg sync.WaitGroup
	next := make(chan struct{}, n)
	for range n {
		next <- struct{}{}
	}
	close(next)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range next {
				res, err := e.reg.Submit(context.Background(), subject, hsScope, SubmitOptions{Source: src, Policy: pol})
				if err != nil {
					t.Errorf("submit %s %s: %v", src, pol, err)
					return
				}
				if res.Outcome != want {
					t.Errorf("submit %s %s: outcome %s, want %s", src, pol, res.Outcome, want)
					return
				}
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
}

// hsKind names an event by what coalescing keys on.
func hsKind(ev Event) string { return ev.Event + "/" + ev.Source + "/" + ev.Outcome }

func hsKinds(evs []Event) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = fmt.Sprintf("%s x%d", hsKind(ev), ev.Count)
	}
	return out
}

// hsCoFields returns the record's coalescing fields (co, c:* and n:*).
func hsCoFields(t testing.TB, e *testEnv, subject string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for f, v := range clRaw(t, e.reg, subject, hsScope) {
		if f == "co" || strings.HasPrefix(f, "c:") || strings.HasPrefix(f, "n:") {
			out[f] = v
		}
	}
	return out
}

// hsStorm makes one queued run of subject meet a storm of requests: 1,000
// manual requests (the first starts the run, 999 join it), 10 foreground
// joins and 3 schedule skips, with Redis time moving on in the middle.
// It returns the run id and the Redis time the storm started at.
func hsStorm(t *testing.T, e *testEnv, subject string, advance func(time.Duration)) string {
	t.Helper()
	first := clSubmit(t, e.reg, subject, hsScope, SourceManual, "")
	if first.Outcome != OutcomeStarted {
		t.Fatalf("first request: %s", first.Outcome)
	}
	hsRepeat(t, e, subject, SourceManual, PolicyJoin, 500, OutcomeJoined)
	advance(5 * time.Millisecond)
	hsRepeat(t, e, subject, SourceManual, PolicyJoin, 499, OutcomeJoined)
	hsRepeat(t, e, subject, SourceForeground, PolicyJoin, 10, OutcomeJoined)
	hsRepeat(t, e, subject, SourceSchedule, PolicySkip, 3, OutcomeSkipped)
	return first.Task.RunID
}

// hsCheckStorm checks the history of hsStorm's run: four events, newest
// first, with the storm's counts.
func hsCheckStorm(t *testing.T, evs []Event, runID string) {
	t.Helper()
	want := []string{"skipped/schedule/skipped x3", "joined/foreground/joined x10", "joined/manual/joined x999", "requested/manual/started x1"}
	var mine []Event
	for _, ev := range evs {
		if ev.RunID == runID && (ev.Event == "requested" || ev.Event == "joined" || ev.Event == "skipped") {
			mine = append(mine, ev)
		}
	}
	if got := hsKinds(mine); !slices.Equal(got, want) {
		t.Fatalf("requests of run %s (newest first):\n got %q\nwant %q", runID, got, want)
	}
	if n := clRequests(mine, "joined"); n != 1009 {
		t.Errorf("the run's joined events stand for %d requests, want 1009", n)
	}
	for _, ev := range mine {
		if ev.At.IsZero() {
			t.Errorf("%s: no time", hsKind(ev))
		}
		switch {
		case ev.Count == 1 && ev.LastAt != nil:
			t.Errorf("%s: a single request has lastAt %v", hsKind(ev), ev.LastAt)
		case ev.Count > 1 && ev.LastAt == nil:
			t.Errorf("%s x%d: no lastAt", hsKind(ev), ev.Count)
		case ev.Count > 1 && ev.LastAt.Before(ev.At):
			t.Errorf("%s: lastAt %v before at %v", hsKind(ev), ev.LastAt, ev.At)
		}
	}
	// Redis time moved 5ms in the middle of the manual joins.
	if j := mine[2]; j.LastAt == nil || j.LastAt.Sub(j.At) < 5*time.Millisecond {
		t.Errorf("manual joins: at %v lastAt %v, want lastAt ≥ at + 5ms", j.At, j.LastAt)
	}
}

// A storm of requests on one active run leaves one event per (source,
// outcome), counting the repeats, instead of an event each.
func TestHistoryCoalescesRepeatedRequests(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			e := newEnv(t, b.Client, Config{Prefix: "hs1", Jobs: []Job{clJob(hsScope, Stage{Name: "only", Handler: &counter{}})}})
			runID := hsStorm(t, e, "u1", b.Advance)
			evs := clHistory(t, e.reg, "u1", hsScope)
			if len(evs) != 4 {
				t.Fatalf("%d events for 1,013 requests, want 4: %q", len(evs), hsKinds(evs))
			}
			hsCheckStorm(t, evs, runID)
			k := taskkey.MustNew("u1", hsScope)
			if n, err := e.rdb.LLen(context.Background(), e.reg.ks.History(k)).Result(); err != nil || n != 4 {
				t.Errorf("history list has %d entries (%v), want 4", n, err)
			}
			co := hsCoFields(t, e, "u1")
			for _, f := range []string{"c:manual:joined", "c:foreground:joined", "c:schedule:skipped"} {
				if !strings.HasPrefix(co[f], runID+" ") {
					t.Errorf("record field %s = %q, want the run's count", f, co[f])
				}
				if !slices.Contains(strings.Split(co["co"], ","), f) {
					t.Errorf("co = %q does not list %s", co["co"], f)
				}
			}
			// The view shows none of it.
			v, err := e.reg.Get(context.Background(), "u1", hsScope)
			if err != nil || v.RunID != runID || v.Status != StatusQueued {
				t.Fatalf("view %+v, %v", v, err)
			}
		})
	}
}

// After the run finishes its counts are still reported (from the record);
// when the key's next run starts they are folded into the list entries and
// the record's fields deleted, and History reports the same counts.
func TestHistoryFoldsCountsWhenNextRunStarts(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			e := newEnv(t, b.Client, Config{Prefix: "hs2", Jobs: []Job{clJob(hsScope, Stage{Name: "only", Handler: &counter{}})}})
			ctx := context.Background()
			k := taskkey.MustNew("u2", hsScope)
			runID := hsStorm(t, e, "u2", b.Advance)
			before := clHistory(t, e.reg, "u2", hsScope)
			hsCheckStorm(t, before, runID)

			_, stop := e.startRunner(RunnerConfig{ID: "hs2", Concurrency: 2})
			if v := e.waitStatus("u2", hsScope, 10*time.Second, StatusDone, StatusFailed); v.Status != StatusDone {
				t.Fatalf("status %s", v.Status)
			}
			stop()
			done := clHistory(t, e.reg, "u2", hsScope)
			hsCheckStorm(t, done, runID)
			if done[0].Event != "done" {
				t.Errorf("newest event %s, want done", done[0].Event)
			}
			if len(hsCoFields(t, e, "u2")) == 0 {
				t.Log("counts were folded at finish already") // allowed, not required
			}

			// The next run starts: the counts move into the list.
			next := clSubmit(t, e.reg, "u2", hsScope, SourceManual, "")
			if next.Outcome != OutcomeStarted || next.Task.RunID == runID {
				t.Fatalf("next request: %s run %s", next.Outcome, next.Task.RunID)
			}
			if co := hsCoFields(t, e, "u2"); len(co) != 0 {
				t.Errorf("after the next run started the record still has %v", co)
			}
			after := clHistory(t, e.reg, "u2", hsScope)
			hsCheckStorm(t, after, runID)
			if len(after) != len(done)+1 || after[0].Event != "requested" || after[0].RunID != next.Task.RunID {
				t.Fatalf("after the next run started: %q, want the old %d events and the new request", hsKinds(after), len(done))
			}
			for i, ev := range after[1:] {
				old := done[i]
				if hsKind(ev) != hsKind(old) || ev.Count != old.Count || !ev.At.Equal(old.At) ||
					(ev.LastAt == nil) != (old.LastAt == nil) || (ev.LastAt != nil && !ev.LastAt.Equal(*old.LastAt)) {
					t.Errorf("event %d changed when folded: %+v, was %+v", i, ev, old)
				}
			}
			// The folded entries carry count and lastAt themselves.
			raw, err := e.rdb.LRange(ctx, e.reg.ks.History(k), 0, -1).Result()
			if err != nil {
				t.Fatal(err)
			}
			folded := 0
			for _, s := range raw {
				if n := len(strings.Split(s, histSep)); n == 11 {
					folded++
				} else if n != 9 {
					t.Errorf("history entry with %d fields: %q", n, s)
				}
			}
			if folded != 3 {
				t.Errorf("%d folded entries, want 3 (the repeated joins and skips): %q", folded, raw)
			}

			// The new run coalesces on its own: its joins are new events.
			clSubmit(t, e.reg, "u2", hsScope, SourceManual, "")
			clSubmit(t, e.reg, "u2", hsScope, SourceManual, "")
			now := clHistory(t, e.reg, "u2", hsScope)
			if j := now[0]; j.Event != "joined" || j.RunID != next.Task.RunID || j.Count != 2 {
				t.Errorf("newest event %q x%d run %s, want the new run's join x2", hsKind(j), j.Count, j.RunID)
			}
			hsCheckStorm(t, now, runID)
		})
	}
}

// The list never exceeds the cap, however many events a key gets, and
// History pages from the newest.
func TestHistoryCapAndNewestFirst(t *testing.T) {
	t.Parallel()
	const hcap = 5
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			e := newEnv(t, b.Client, Config{Prefix: "hs3", HistoryCap: hcap,
				Jobs: []Job{clJob(hsScope, Stage{Name: "one", Handler: &counter{}}, Stage{Name: "two", Handler: &counter{}})}})
			ctx := context.Background()
			k := taskkey.MustNew("u3", hsScope)
			llen := func() int64 {
				n, err := e.rdb.LLen(ctx, e.reg.ks.History(k)).Result()
				if err != nil {
					t.Fatal(err)
				}
				return n
			}
			clSubmit(t, e.reg, "u3", hsScope, SourceManual, "")
			appended := []string{"requested/manual/started"}
			outcome := map[Policy][2]string{PolicyJoin: {"joined", "joined"}, PolicySkip: {"skipped", "skipped"}, PolicyQueue: {"requested", "queued"}}
			for _, src := range []Source{SourceManual, SourceForeground, SourceSchedule, SourceRetry} {
				for _, pol := range []Policy{PolicyJoin, PolicySkip, PolicyQueue} {
					b.Advance(time.Millisecond)
					clSubmit(t, e.reg, "u3", hsScope, src, pol)
					o := outcome[pol]
					appended = append(appended, o[0]+"/"+string(src)+"/"+o[1])
					if n := llen(); n > hcap {
						t.Fatalf("history list has %d entries, cap %d", n, hcap)
					}
				}
			}
			slices.Reverse(appended)
			want := appended[:hcap]
			evs, err := e.reg.History(ctx, "u3", hsScope, 100)
			if err != nil {
				t.Fatal(err)
			}
			got := make([]string, len(evs))
			for i, ev := range evs {
				got[i] = hsKind(ev)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("History(100) with cap %d:\n got %q\nwant %q (newest first)", hcap, got, want)
			}
			for i := 1; i < len(evs); i++ {
				if evs[i].At.After(evs[i-1].At) {
					t.Errorf("event %d (%v) is newer than event %d (%v)", i, evs[i].At, i-1, evs[i-1].At)
				}
			}
			for _, limit := range []int{1, 3, hcap} {
				top, err := e.reg.History(ctx, "u3", hsScope, limit)
				if err != nil || len(top) != limit {
					t.Fatalf("History(%d) = %d events, %v", limit, len(top), err)
				}
				for i := range top {
					if hsKind(top[i]) != want[i] {
						t.Errorf("History(%d)[%d] = %s, want %s", limit, i, hsKind(top[i]), want[i])
					}
				}
			}
			if all, err := e.reg.History(ctx, "u3", hsScope, 0); err != nil || len(all) != hcap {
				t.Errorf("History(0) = %d events, %v; want the cap, %d", len(all), err, hcap)
			}

			// Run it and its queued follow-up: many more events (stages,
			// done, the follow-up's request), still capped; the folding of
			// counts whose events were trimmed away is harmless.
			hsRepeat(t, e, "u3", SourceSchedule, PolicyQueue, 20, OutcomeQueued)
			e.startRunner(RunnerConfig{ID: "hs3", Concurrency: 1})
			waitFor(t, 10*time.Second, "run and follow-up done", func() bool {
				evs := clHistory(t, e.reg, "u3", hsScope)
				return clCount(evs, "done") >= 1 && clRaw(t, e.reg, "u3", hsScope)["status"] == string(StatusDone)
			})
			if n := llen(); n != hcap {
				t.Errorf("history list has %d entries after two runs, want the cap %d", n, hcap)
			}
			evs = clHistory(t, e.reg, "u3", hsScope)
			v, err := e.reg.Get(ctx, "u3", hsScope)
			if err != nil {
				t.Fatal(err)
			}
			if len(evs) != hcap || evs[0].Event != "done" || evs[0].RunID != v.RunID {
				t.Errorf("after the follow-up: %q (run %s), want %d events, newest the follow-up's done", clEventNames(evs), v.RunID, hcap)
			}
		})
	}
}

// hsEncode builds a history entry as lua/lib/history.lua hist_ev does (and,
// with count > 1, as co_fold leaves it).
func hsEncode(at int64, event, runID, source, stage, outcome, owner string, token int64, errText string, count int, lastAt int64) string {
	f := []string{strconv.FormatInt(at, 10), event, runID, source, stage, outcome, owner, strconv.FormatInt(token, 10), errText}
	if count > 1 {
		f = append(f, strconv.Itoa(count), strconv.FormatInt(lastAt, 10))
	}
	return strings.Join(f, histSep)
}

// parseEvent never panics, and decodes what hist_ev and co_fold encode.
func FuzzParseEvent(f *testing.F) {
	f.Add(int64(1767225600000), "joined", "r1", "manual", "", "joined", "", int64(0), "", 1000, int64(1767225600005))
	f.Add(int64(1), "failed", "r2", "", "pushing", "", "pod-a/x", int64(1767225600000123), "boom: 409", 1, int64(0))
	f.Add(int64(0), "", "", "", "", "", "", int64(-1), "", 2, int64(-5))
	f.Fuzz(func(t *testing.T, at int64, event, runID, source, stage, outcome, owner string, token int64, errText string, count int, lastAt int64) {
		// Raw input, whatever it is, decodes without panicking.
		for _, s := range []string{event, runID + histSep + event, errText + histSep + histSep + owner} {
			ev := parseEvent(s)
			if ev.Count < 1 || (ev.Count == 1 && ev.LastAt != nil) {
				t.Fatalf("parseEvent(%q): count %d lastAt %v", s, ev.Count, ev.LastAt)
			}
		}
		// A well-formed entry round-trips. Fields never hold the separator
		// (hist_ev replaces it in errors; the others are names and ids).
		clean := func(s string) string { return strings.ReplaceAll(s, histSep, " ") }
		event, runID, source, stage, outcome, owner, errText = clean(event), clean(runID), clean(source), clean(stage), clean(outcome), clean(owner), clean(errText)
		if count < 1 {
			count = 1
		}
		ev := parseEvent(hsEncode(at, event, runID, source, stage, outcome, owner, token, errText, count, lastAt))
		want := Event{At: checkpoints.MillisTime(strconv.FormatInt(at, 10)), Event: event, RunID: runID, Source: source,
			Stage: stage, Outcome: outcome, Owner: owner, FencingToken: token, Error: errText, Count: count}
		if count > 1 {
			want.LastAt = timeField(strconv.FormatInt(lastAt, 10))
		}
		if !ev.At.Equal(want.At) || ev.Event != want.Event || ev.RunID != want.RunID || ev.Source != want.Source ||
			ev.Stage != want.Stage || ev.Outcome != want.Outcome || ev.Owner != want.Owner ||
			ev.FencingToken != want.FencingToken || ev.Error != want.Error || ev.Count != want.Count ||
			(ev.LastAt == nil) != (want.LastAt == nil) || (ev.LastAt != nil && !ev.LastAt.Equal(*want.LastAt)) {
			t.Fatalf("round trip:\n got %+v\nwant %+v", ev, want)
		}
	})
}

// A stage error holding the field separator cannot shift the fields of its
// event (hist_ev replaces it), and the event reads back whole.
func TestHistoryErrorWithSeparator(t *testing.T) {
	t.Parallel()
	m := redistest.StartMini(t)
	fail := HandlerFunc(func(context.Context, *Run) error { return fmt.Errorf("bad%sthing", histSep) })
	e := newEnv(t, m.Client(t), Config{Prefix: "hs4",
		Jobs: []Job{{Scope: hsScope, Stages: []Stage{{Name: "only", Handler: fail}}, Retry: RetryPolicy{MaxAttempts: 1}}}})
	rn, _ := e.startRunner(RunnerConfig{ID: "hs4"})
	clSubmit(t, e.reg, "u4", hsScope, SourceManual, "")
	if v := e.waitStatus("u4", hsScope, 10*time.Second, StatusFailed, StatusDone); v.Status != StatusFailed {
		t.Fatalf("status %s, want failed", v.Status)
	}
	ev, ok := clFind(clHistory(t, e.reg, "u4", hsScope), "failed")
	if !ok {
		t.Fatal("no failed event")
	}
	if ev.Error != "bad thing" || ev.Owner != rn.Owner() || ev.FencingToken == 0 || ev.Stage != "only" || ev.Count != 1 {
		t.Errorf("failed event %+v: want error %q, owner %s, a token, stage only", ev, "bad thing", rn.Owner())
	}
}

// Throttled requests on a finished run are coalesced too (against that
// run), and folded when the next run starts.
func TestHistoryCoalescesThrottled(t *testing.T) {
	t.Parallel()
	m := redistest.StartMini(t)
	e := newEnv(t, m.Client(t), Config{Prefix: "hs5",
		Jobs: []Job{{Scope: hsScope, Stages: []Stage{{Name: "only", Handler: &counter{}}}, MinInterval: time.Hour}}})
	first := clSubmit(t, e.reg, "u5", hsScope, SourceManual, "")
	_, stop := e.startRunner(RunnerConfig{ID: "hs5"})
	if v := e.waitStatus("u5", hsScope, 10*time.Second, StatusDone, StatusFailed); v.Status != StatusDone {
		t.Fatalf("status %s", v.Status)
	}
	stop()
	m.Advance(time.Second)
	hsRepeat(t, e, "u5", SourceSchedule, "", 50, OutcomeThrottled)
	m.Advance(time.Second)
	hsRepeat(t, e, "u5", SourceForeground, "", 20, OutcomeThrottled)
	check := func(what string) {
		t.Helper()
		evs := clHistory(t, e.reg, "u5", hsScope)
		var got []string
		for _, ev := range evs {
			if ev.Event == "throttled" {
				got = append(got, fmt.Sprintf("%s x%d", hsKind(ev), ev.Count))
				if ev.RunID != first.Task.RunID || ev.LastAt == nil || ev.LastAt.Before(ev.At) {
					t.Errorf("%s: %+v, want run %s and lastAt ≥ at", what, ev, first.Task.RunID)
				}
			}
		}
		want := []string{"throttled/foreground/throttled x20", "throttled/schedule/throttled x50"}
		if !slices.Equal(got, want) {
			t.Errorf("%s: throttled events %q, want %q", what, got, want)
		}
	}
	check("before the next run")
	// A manual request is never throttled: the next run starts and folds.
	if r := clSubmit(t, e.reg, "u5", hsScope, SourceManual, ""); r.Outcome != OutcomeStarted {
		t.Fatalf("manual after throttles: %s", r.Outcome)
	}
	if co := hsCoFields(t, e, "u5"); len(co) != 0 {
		t.Errorf("record keeps %v after the next run started", co)
	}
	check("after the next run started")
}

// afterRead is a go-redis hook that runs fn once, right after the first
// pipeline holding an LRANGE (History's read) was answered.
type afterRead struct {
	once sync.Once
	fn   func()
}

func (h *afterRead) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *afterRead) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *afterRead) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			if c.Name() == "lrange" {
				h.once.Do(h.fn)
				break
			}
		}
		return err
	}
}

// A run that starts while History reads folds the previous run's counts
// into the list and deletes the record's fields; History reads both in one
// transaction, so it reports the counts from one side of that or the
// other, never neither.
func TestHistoryReadRacingAFoldKeepsCounts(t *testing.T) {
	mini := redistest.StartMini(t)
	rdb := mini.Client(t)
	e := newEnv(t, rdb, Config{Prefix: "hs-race", Jobs: []Job{clJob(hsScope, Stage{Name: "only", Handler: &counter{}})}})
	ctx := context.Background()
	first := clSubmit(t, e.reg, "u1", hsScope, SourceForeground, "")
	for range 3 {
		clSubmit(t, e.reg, "u1", hsScope, SourceSchedule, "")
	}
	if out, err := e.reg.Cancel(ctx, "u1", hsScope); err != nil {
		t.Fatalf("cancel: %v %v", out, err)
	}
	hook := &afterRead{fn: func() { clSubmit(t, e.reg, "u1", hsScope, SourceManual, "") }}
	rdb.AddHook(hook)
	evs := clHistory(t, e.reg, "u1", hsScope)
	var joined *Event
	for i := range evs {
		if evs[i].Event == "joined" && evs[i].RunID == first.Task.RunID {
			joined = &evs[i]
		}
	}
	if joined == nil || joined.Count != 3 {
		t.Fatalf("the first run's schedule joins: %+v, want one event with count 3 (%q)", joined, hsKinds(evs))
	}
	if v, err := e.reg.Get(ctx, "u1", hsScope); err != nil || v.RunID == first.Task.RunID {
		t.Fatalf("the next run did not start during the read: %+v %v", v, err)
	}
}

// Repeats are counted in a decimal string bumped in place (lib/history.lua
// repeat_count): the count must carry through 9, 19, 99 and 109, in the
// embedded Redis's Lua and in a Redis 7 Functions library alike.
func TestRepeatCountCarries(t *testing.T) {
	for _, backend := range []string{"miniredis", "redis-server"} {
		t.Run(backend, func(t *testing.T) {
			var rdb *redis.Client
			if backend == "miniredis" {
				rdb = redistest.StartMini(t).Client(t)
			} else {
				rdb = redistest.StartServer(t).Client(t)
			}
			e := newEnv(t, rdb, Config{Prefix: "hs-count", Jobs: []Job{clJob(hsScope, Stage{Name: "only", Handler: &counter{}})}})
			first := clSubmit(t, e.reg, "u1", hsScope, SourceForeground, "")
			const repeats = 121
			for range repeats {
				clSubmit(t, e.reg, "u1", hsScope, SourceSchedule, "")
			}
			var joined *Event
			evs := clHistory(t, e.reg, "u1", hsScope)
			for i := range evs {
				if evs[i].Event == "joined" && evs[i].RunID == first.Task.RunID {
					joined = &evs[i]
				}
			}
			if joined == nil || joined.Count != repeats {
				t.Fatalf("the run's schedule joins: %+v, want one event with count %d (%q)", joined, repeats, hsKinds(evs))
			}
		})
	}
}
