//go:build unix

package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/jobs"
)

// TestLimiterCapUnderFaults: a fleet-wide limiter of concurrency 5, shared
// by two jobs whose HTTP stages write to a downstream that fences by task
// key and by limiter slot (docs/flow-control.md, "Fencing the slots"),
// keeps at most 5 writers accepted at once across three `runner serve`
// processes while one of them is SIGKILLed holding slots and another is
// SIGSTOPped past its lease TTL and resumed. It also checks that the fleet
// uses the whole limit: 5 at once before the faults, and again within the
// lease TTL + 1 s of the kill; that the paused runner's late writes are
// refused; and that all 300 runs end done.
//
// A few runs hold their first write for twice the TTL: their slots live
// only by their heartbeats' renewals, so a runner that stopped renewing
// slots would let a sixth writer in. The downstream's work is request-
// scoped: a write whose client went away (the killed runner) ends there;
// and the runner is paused only while none of its writes would outlast
// half the TTL (a paused client's connection stays open, and a write
// accepted before the pause and still at work when its slot passes on
// overlaps the next holder's: a downstream that serializes a slot's
// writes, as a row lock held to commit does, would queue the next one).
func TestLimiterCapUnderFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("three runner processes for ~30 s: not in -short")
	}
	const (
		keys  = 300
		limit = 5
		ttl   = 1500 * time.Millisecond
	)
	began := time.Now()
	rs := redistest.StartServer(t) // skips without redis-server (fails with TASKLEASE_REQUIRE_REDIS=1)
	dir := t.TempDir()
	bin := buildRunner(t, dir)

	subjects := make([]string, keys)
	long := map[string]bool{}
	for i := range subjects {
		subjects[i] = fmt.Sprintf("k%03d", i)
		if i%50 == 7 {
			long[subjects[i]] = true
		}
	}
	rec := newCapRecorder(limit, ttl/2, func(subject, stage string) time.Duration {
		if long[subject] && stage == "pulling" {
			return 2 * ttl // outlives the slot's TTL: only renewals keep the slot
		}
		return time.Duration(100+rand.IntN(101)) * time.Millisecond // the work
	})
	down := httptest.NewServer(rec)
	t.Cleanup(down.Close) // after the runners' cleanups (LIFO): no request is left waiting
	t.Cleanup(rec.cont)   // before down.Close: a write held for a pause is let go

	var jobsYAML strings.Builder
	for _, scope := range []string{"alpha", "beta"} {
		fmt.Fprintf(&jobsYAML, "  %s:\n    limiters: [remote]\n    retry: {maxAttempts: 3, backoff: 100ms, maxBackoff: 1s}\n    stages:\n", scope)
		for _, stage := range []string{"pulling", "pushing"} {
			fmt.Fprintf(&jobsYAML, "      - {name: %s, http: {url: %q, headers: {X-Runner: \"${TASKLEASE_RUNNER_ID}\"}}}\n",
				stage, down.URL+"/"+stage)
		}
	}
	cfgText := fmt.Sprintf(`
partitions: 4
runner:
  id: "${TASKLEASE_RUNNER_ID}"
  concurrency: 8
  leaseTTL: %s
  shutdownGrace: 1s
log:
  level: warn
limiters:
  remote: {concurrency: %d}
jobs:
%s`, ttl, limit, jobsYAML.String())
	cfgPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfgText), 0o600); err != nil {
		t.Fatal(err)
	}
	redisURL := "redis://" + rs.Addr() + "/0"
	var pods [3]*runnerProc
	for i := range pods {
		pods[i] = startRunner(t, bin, cfgPath, redisURL, fmt.Sprintf("pod-%c", 'a'+i))
	}
	podByID := map[string]*runnerProc{}
	for _, p := range pods {
		podByID[p.id] = p
	}

	// Submit the 300 runs, half to each job, through all three runners.
	scopeOf := func(i int) string { return []string{"alpha", "beta"}[i%2] }
	start := time.Now()
	submitSpread(t, pods[:], keys, func(i int) string { return taskPath(subjects[i], scopeOf(i)) + "/runs" }, `{"source":"schedule"}`)

	// pickHolder waits until limit writes from runners not in skip are
	// accepted at once, and returns the runner with the most of them.
	pickHolder := func(what string, skip ...string) (*runnerProc, int) {
		t.Helper()
		var id string
		var n int
		eventually(t, 15*time.Second, what, func() error {
			var ok bool
			if id, n, ok = rec.heaviest(skip...); !ok {
				return fmt.Errorf("not %d writes accepted at once yet (max so far %d)", limit, rec.maxSeen())
			}
			return nil
		})
		return podByID[id], n
	}

	// SIGKILL the runner holding the most slots while the limit is in use.
	victim, held := pickHolder("the limit in use before the kill")
	killFault := rec.fault(victim.id)
	if err := victim.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	t.Logf("killed %s with %d of the %d writes at work its own (max accepted at once before: %d)", victim.id, held, limit, killFault.maxBefore)
	backAfterKill := rec.waitBack(t, killFault, ttl+5*time.Second)
	if backAfterKill < 0 || backAfterKill > ttl+time.Second {
		t.Errorf("after the kill of %s: back at %d accepted at once after %v, want within the lease TTL + 1s (%v)",
			victim.id, limit, backAfterKill, ttl+time.Second)
	}

	// SIGSTOP the survivor holding the most slots for twice the TTL, then
	// SIGCONT it: its slots pass on meanwhile, and what it still sends
	// with them is refused. It is stopped as its next write arrives, and
	// that write is judged only after the SIGCONT: a write in flight while
	// its writer was paused, so there is at least one late write.
	paused, _ := pickHolder("the limit in use before the pause", victim.id)
	var api *runnerProc // the runner neither killed nor paused
	for _, p := range pods {
		if p != victim && p != paused {
			api = p
		}
	}
	t.Cleanup(func() { _ = paused.cmd.Process.Signal(syscall.SIGCONT) }) // if the test ends during the pause
	rec.armPause(paused.id, func() error { return paused.cmd.Process.Signal(syscall.SIGSTOP) })
	var stopFault *capFault
	var pheld int
	eventually(t, 10*time.Second, "the pause of "+paused.id+" at its next write", func() error {
		var err error
		stopFault, pheld, err = rec.pausedAt()
		return err
	})
	time.Sleep(2 * ttl) // the fault itself, not a wait for state
	rec.cont()
	if err := paused.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	backAfterStop := rec.waitBack(t, stopFault, 0)
	t.Logf("paused %s for %v as it sent a write, with %d more of its writes accepted then", paused.id, 2*ttl, pheld)

	// Every run ends done: the killed and the paused runners' runs are
	// taken over.
	var views []jobs.TaskView
	deadline := time.Now().Add(120 * time.Second)
	for {
		var err error
		views, err = listScopes(api.url, []string{"alpha", "beta"})
		done := 0
		for _, v := range views {
			if finished(v.Status) {
				done++
			}
		}
		if err == nil && done == keys {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d runs finished after 120s (list: %v)", done, keys, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	elapsed := time.Since(start)
	retried := 0
	var notDone []string
	for _, v := range views {
		if v.Status != jobs.StatusDone {
			notDone = append(notDone, fmt.Sprintf("  %s ended %s at attempt %d: %s", v.Key, v.Status, v.Attempt, v.LastError))
		}
		if v.Attempt > 1 {
			retried++
		}
	}

	s := rec.summary()
	if s.max > limit {
		t.Errorf("%d writes accepted at once, limit %d; the first times over it:\n%s", s.max, limit, strings.Join(s.over[:min(3, len(s.over))], "\n"))
	}
	if len(notDone) > 0 {
		t.Errorf("%d of %d runs did not end done, e.g.\n%s", len(notDone), keys, strings.Join(notDone[:min(5, len(notDone))], "\n"))
	}
	for _, b := range s.bad[:min(5, len(s.bad))] {
		t.Errorf("malformed write: %s", b)
	}
	if killFault.maxBefore != limit {
		t.Errorf("before the faults at most %d writes were accepted at once, want the limit %d", killFault.maxBefore, limit)
	}
	if s.late.sent == 0 {
		t.Errorf("no late write of the paused %s was seen", paused.id)
	}
	if s.late.accepted > 0 {
		t.Errorf("%d late writes of the paused %s were accepted:\n%s", s.late.accepted, paused.id, strings.Join(s.lateAccepted, "\n"))
	}
	if len(s.slotOverlaps) > 0 {
		t.Errorf("%d times two holders of one slot were accepted at once, e.g.\n%s", len(s.slotOverlaps), strings.Join(s.slotOverlaps[:min(5, len(s.slotOverlaps))], "\n"))
	}
	if s.writes < 2*keys {
		t.Errorf("%d writes accepted, want at least %d (two stages per run)", s.writes, 2*keys)
	}
	t.Logf("max accepted at once: %d (limit %d); back at %d after the kill of %s: %v; after the pause of %s: %v",
		s.max, limit, limit, victim.id, backAfterKill.Round(time.Millisecond), paused.id, backAfterStop.Round(time.Millisecond))
	t.Logf("late writes of %s after SIGCONT: %d, refused %d, accepted %d; %d of its writes arrived during the pause",
		paused.id, s.late.sent, s.late.refused, s.late.accepted, s.duringPause)
	t.Logf("%d writes accepted (%d of them cut short by their client going away), %d refused (409) in all; %d of %d runs needed a second attempt; runs took %v, the test %v",
		s.writes, s.gone, s.refused, retried, keys, elapsed.Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
}

// listScopes lists every run of the scopes through base.
func listScopes(base string, scopes []string) ([]jobs.TaskView, error) {
	var out []jobs.TaskView
	for _, scope := range scopes {
		var page struct {
			Tasks []jobs.TaskView `json:"tasks"`
		}
		q := url.Values{"scope": {scope}, "limit": {strconv.Itoa(jobs.ListLimitMax)}}
		code, err := getJSON(base+"/v1/tasks?"+q.Encode(), "", &page)
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("list %s: status %d", scope, code)
		}
		if err != nil {
			return nil, err
		}
		out = append(out, page.Tasks...)
	}
	return out, nil
}

// capWrite is one write the recorder accepted: from its acceptance to its
// answer.
type capWrite struct {
	runner, key, stage string
	slot               int
	slotToken, fencing int64
	hold               time.Duration // the work it was to do
	from, to           time.Time
}

func (w *capWrite) String() string {
	return fmt.Sprintf("%s %s/%s slot %d token %d fencing %d", w.runner, w.key, w.stage, w.slot, w.slotToken, w.fencing)
}

// capFault is a runner taken out (killed or paused) at a time, and when
// the other runners had limit writes accepted at once again.
type capFault struct {
	runner    string
	at        time.Time
	maxBefore int       // the most accepted at once before it
	back      time.Time // the first instant after it with limit accepted at once, none from a faulted runner
}

// capRecorder is a downstream fencing by task key and by limiter slot, as
// docs/flow-control.md tells one to: it accepts a write only if its slot
// token is at least the highest accepted for its slot and its fencing
// token at least the highest accepted for its key, else answers 409. An
// accepted write holds the request for a while (the work) before it
// answers 204; the recorder counts the writes accepted at every instant.
type capRecorder struct {
	limit int
	hold  func(subject, stage string) time.Duration
	// pauseBy: the armed runner is paused only while none of its writes
	// is to work longer than this
	pauseBy time.Duration

	mu       sync.Mutex
	slotTop  map[int]int64
	keyTop   map[string]int64
	live     map[*capWrite]struct{}
	byRunner map[string]int
	cur, max int
	ended    []*capWrite
	gone     int // writes whose client went away before their work was done
	refused  int
	bad      []string
	over     []string // the writes accepted at once, each time there were more than limit
	faults   []*capFault

	// the pause: armed names the runner to SIGSTOP (with stopFn) when its
	// next write arrives; that write waits for resumed. Late writes are
	// that one and those of the paused runner after its SIGCONT with a
	// slot token no higher than any seen before the SIGCONT (a grant it
	// got before the pause; one got after is higher).
	armed          string
	stopFn         func() error
	stopErr        error
	resumed        chan struct{}
	paused         string
	pauseFault     *capFault
	pausedHeld     int // the paused runner's writes accepted when it was stopped
	stopAt, contAt time.Time
	seenTop        int64 // the highest slot token seen
	contTop        int64 // seenTop at the SIGCONT
	duringPause    int
	late           capLate
	lateAccepted   []string
}

type capLate struct{ sent, refused, accepted int }

func newCapRecorder(limit int, pauseBy time.Duration, hold func(subject, stage string) time.Duration) *capRecorder {
	return &capRecorder{limit: limit, pauseBy: pauseBy, hold: hold, slotTop: map[int]int64{}, keyTop: map[string]int64{},
		live: map[*capWrite]struct{}{}, byRunner: map[string]int{}, resumed: make(chan struct{})}
}

func (c *capRecorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Subject string `json:"subject"`
		Stage   string `json:"stage"`
	}
	_ = json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&body)
	_, _ = io.Copy(io.Discard, r.Body) // read to its end: the server then notices the client going away
	wr := &capWrite{runner: r.Header.Get("X-Runner"), key: r.Header.Get(jobs.HTTPKeyHeader), stage: body.Stage,
		hold: c.hold(body.Subject, body.Stage)}
	var problem string
	var err error
	if wr.fencing, err = strconv.ParseInt(r.Header.Get(jobs.HTTPFencingTokenHeader), 10, 64); err != nil || wr.fencing <= 0 {
		problem = "fencing token " + strconv.Quote(r.Header.Get(jobs.HTTPFencingTokenHeader))
	}
	slots := r.Header.Get(jobs.HTTPLimiterSlotsHeader)
	f := strings.Split(slots, ":")
	if len(f) != 3 || f[0] != "remote" {
		problem = "limiter slots " + strconv.Quote(slots)
	} else {
		slot, err1 := strconv.Atoi(f[1])
		tok, err2 := strconv.ParseInt(f[2], 10, 64)
		if err1 != nil || err2 != nil || slot < 0 || slot >= c.limit || tok <= 0 {
			problem = "limiter slots " + strconv.Quote(slots)
		}
		wr.slot, wr.slotToken = slot, tok
	}
	if wr.runner == "" || wr.key == "" || body.Subject == "" || !strings.HasPrefix(wr.key, body.Subject+"|") {
		problem = fmt.Sprintf("runner %q key %q subject %q", wr.runner, wr.key, body.Subject)
	}

	if problem != "" {
		c.mu.Lock()
		c.bad = append(c.bad, problem)
		c.mu.Unlock()
		http.Error(w, problem, http.StatusBadRequest)
		return
	}
	late := c.pauseOn(wr)
	if late {
		<-c.resumed
	}

	c.mu.Lock()
	now := time.Now()
	c.seenTop = max(c.seenTop, wr.slotToken)
	if late {
		c.late.sent++
	} else if wr.runner == c.paused {
		switch {
		case c.contAt.IsZero():
			c.duringPause++
		case wr.slotToken <= c.contTop:
			late = true
			c.late.sent++
		}
	}
	if wr.slotToken < c.slotTop[wr.slot] || wr.fencing < c.keyTop[wr.key] {
		c.refused++
		if late {
			c.late.refused++
		}
		c.mu.Unlock()
		http.Error(w, "stale token", http.StatusConflict)
		return
	}
	c.slotTop[wr.slot] = wr.slotToken
	c.keyTop[wr.key] = wr.fencing
	wr.from = now
	c.live[wr] = struct{}{}
	c.byRunner[wr.runner]++
	c.cur++
	c.max = max(c.max, c.cur)
	if c.cur > c.limit && len(c.over) < 20 {
		c.over = append(c.over, c.liveText(now))
	}
	if late {
		c.late.accepted++
		c.lateAccepted = append(c.lateAccepted, wr.String())
	}
	for i, f := range c.faults {
		if !f.back.IsZero() {
			continue
		}
		n := c.cur
		for _, g := range c.faults[:i+1] {
			n -= c.byRunner[g.runner]
		}
		if n >= c.limit {
			f.back = now
		}
	}
	c.mu.Unlock()

	work := time.NewTimer(wr.hold)
	defer work.Stop()
	gone := false
	select {
	case <-work.C:
	case <-r.Context().Done(): // the client went away: so does its work
		gone = true
	}

	c.mu.Lock()
	wr.to = time.Now()
	if gone {
		c.gone++
	}
	delete(c.live, wr)
	c.byRunner[wr.runner]--
	c.cur--
	c.ended = append(c.ended, wr)
	c.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

// liveText lists the writes accepted now. The caller holds c.mu.
func (c *capRecorder) liveText(now time.Time) string {
	var lines []string
	for w := range c.live {
		lines = append(lines, fmt.Sprintf("  %s (accepted %v ago)", w, now.Sub(w.from).Round(time.Millisecond)))
	}
	slices.Sort(lines)
	return fmt.Sprintf("at %s:\n%s", now.Format("15:04:05.000"), strings.Join(lines, "\n"))
}

// heaviest reports, when limit writes of runners not in skip are accepted
// at once, the runner with the most of them and how many it has.
func (c *capRecorder) heaviest(skip ...string) (string, int, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.cur
	for _, s := range skip {
		n -= c.byRunner[s]
	}
	if n < c.limit {
		return "", 0, false
	}
	best, most := "", 0
	for r, k := range c.byRunner {
		if k > most && !slices.Contains(skip, r) {
			best, most = r, k
		}
	}
	return best, most, true
}

func (c *capRecorder) maxSeen() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.max
}

// fault records that runner is taken out now.
func (c *capRecorder) fault(runner string) *capFault {
	c.mu.Lock()
	defer c.mu.Unlock()
	f := &capFault{runner: runner, at: time.Now(), maxBefore: c.max}
	c.faults = append(c.faults, f)
	return f
}

// armPause has stop called when runner's next write arrives; that write
// is judged after cont.
func (c *capRecorder) armPause(runner string, stop func() error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.armed, c.stopFn = runner, stop
}

// pauseOn pauses w's runner if it is armed, and reports whether it did.
func (c *capRecorder) pauseOn(w *capWrite) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.armed == "" || w.runner != c.armed {
		return false
	}
	now := time.Now()
	for l := range c.live {
		if l.runner == w.runner && l.from.Add(l.hold).After(now.Add(c.pauseBy)) {
			return false // it works on past the slot's TTL: wait for a later write
		}
	}
	c.armed = ""
	c.pausedHeld = c.byRunner[w.runner]
	c.pauseFault = &capFault{runner: w.runner, at: now, maxBefore: c.max}
	c.faults = append(c.faults, c.pauseFault)
	c.paused, c.stopAt = w.runner, c.pauseFault.at
	c.stopErr = c.stopFn()
	return true
}

// pausedAt returns the pause once it happened, and how many writes of the
// paused runner were accepted then.
func (c *capRecorder) pausedAt() (*capFault, int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.stopErr != nil:
		return nil, 0, c.stopErr
	case c.pauseFault == nil:
		return nil, 0, fmt.Errorf("no write of %s yet", c.armed)
	}
	return c.pauseFault, c.pausedHeld, nil
}

// cont records that the paused runner resumes now, and lets its held
// write be judged.
func (c *capRecorder) cont() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.contAt.IsZero() {
		c.contAt, c.contTop = time.Now(), c.seenTop
		close(c.resumed)
	}
}

// waitBack waits up to timeout for f's back-at-limit instant and returns
// it as a time after the fault, or -1 if it did not come; with timeout 0
// it only looks.
func (c *capRecorder) waitBack(t *testing.T, f *capFault, timeout time.Duration) time.Duration {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		c.mu.Lock()
		back := f.back
		c.mu.Unlock()
		if !back.IsZero() {
			return back.Sub(f.at)
		}
		if !time.Now().Before(deadline) {
			return -1
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// capSummary is what the recorder saw, once every run has ended.
type capSummary struct {
	max, writes, refused, duringPause, gone int
	late                                    capLate
	bad, over, lateAccepted                 []string
	// slotOverlaps: two accepted writes of one slot overlapping in time
	// with different tokens, i.e. two holders of one slot writing at once
	slotOverlaps []string
}

func (c *capRecorder) summary() capSummary {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := capSummary{max: c.max, writes: len(c.ended) + len(c.live), refused: c.refused, duringPause: c.duringPause, gone: c.gone,
		late: c.late, bad: c.bad, over: c.over, lateAccepted: c.lateAccepted}
	bySlot := map[int][]*capWrite{}
	for _, w := range c.ended {
		bySlot[w.slot] = append(bySlot[w.slot], w)
	}
	for _, ws := range bySlot {
		slices.SortFunc(ws, func(a, b *capWrite) int { return a.from.Compare(b.from) })
		open := ws[0] // of the writes so far, the one answered last
		for _, w := range ws[1:] {
			if w.from.Before(open.to) && w.slotToken != open.slotToken {
				s.slotOverlaps = append(s.slotOverlaps, fmt.Sprintf("  %s [%s, %s] and %s from %s", open,
					open.from.Format("15:04:05.000"), open.to.Format("15:04:05.000"), w, w.from.Format("15:04:05.000")))
			}
			if w.to.After(open.to) {
				open = w
			}
		}
	}
	return s
}
