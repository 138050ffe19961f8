//go:build linux

package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/keyspace"
	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/jobs"
	"github.com/tasklease/tasklease/taskkey"
)

const (
	chaosSchedule   = "chaos-bulk"
	chaosPrefix     = "tasklease"
	chaosBulk       = "bulk"
	chaosSync       = "sync"
	chaosHistoryCap = 2000
	chaosBulkN      = 400 // subjects of the bulk job: ~200 live runs per partition
	chaosSyncN      = 12
)

// chaosEpoch is one stretch of the run without Redis data loss: the cron
// occurrences fired in it and the keys' state at its end.
type chaosEpoch struct {
	start, end int64 // checked window (Redis ms): subjects seeded .. Redis lost or cron stopped
	fired      []int64
	states     map[int64]occState
	keys       map[string]*keyData
}

type chaosStop struct {
	marker   string
	from, to time.Time
}

type chaosHarness struct {
	t                      *testing.T
	seed                   int64
	rng                    *rand.Rand // fault schedule; main goroutine only
	dir, bin, execLog      string
	cfgCron, cfgPlain      string
	nonce, redisURL        string
	rs                     *redistest.Server
	rdb                    *redis.Client
	ks                     *keyspace.Space
	rec                    *recorder
	viol                   chaosViolations
	bulk, syncs            []string
	keys                   []taskkey.Key
	ids                    []string
	redisDown, redisUp     time.Time // the restart, once
	epochs                 []*chaosEpoch
	bg                     sync.WaitGroup
	t0                     time.Time
	stateKey, leaderKey    string
	kills, leaderKills     atomic.Int64
	midFanOut, stops, errs atomic.Int64
	graceful, descSeen     atomic.Int64
	goneMax                atomic.Int64 // longest wait for a dead runner's processes to go (ns)
	submits, cancels       atomic.Int64
	fgs, redisRestarts     atomic.Int64

	mu      sync.Mutex
	runners map[string]*chaosRunner
	all     []*chaosRunner
	incs    int
	stopLog []chaosStop
	outc    map[string]int
	killed  map[int64]int // occurrences whose fan-out a leader kill interrupted → epoch

	stMu   sync.Mutex
	states []map[int64]occState // per epoch, from the poller
}

// TestChaosE2E is the chaos soak of the product as deployed: three
// `runner serve` binaries on one real redis-server, an http job (bulk)
// whose downstream checks fencing tokens, an exec job (sync) whose stage
// daemonises helpers, and a cron schedule on bulk for every subject. It
// submits and cancels at random through the runners' APIs while it
// SIGKILLs runners (the cron leader mid-fan-out among them), SIGSTOPs them
// past their lease TTL, and restarts Redis empty once. Then it checks:
// no key is stuck; tokens never go backwards (also across the data loss);
// no descendant of an exec stage survives its stage or its runner;
// every subject gets exactly one request per cron occurrence; no two
// executions of a key overlap unless the older one was refused.
//
// TASKLEASE_CHAOS_E2E=10m runs it longer; TASKLEASE_CHAOS_SEED replays
// the random choices of a run; the runners' logs of a failed run are kept
// in $TMPDIR/tasklease-chaos-e2e-<seed> (TASKLEASE_CHAOS_LOGS=DIR keeps
// them for any run).
func TestChaosE2E(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs a chaos soak of runner processes")
	}
	dur, long := 30*time.Second, false
	if v := os.Getenv("TASKLEASE_CHAOS_E2E"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 10*time.Second {
			t.Fatalf("TASKLEASE_CHAOS_E2E=%q: want a duration of at least 10s", v)
		}
		dur, long = d, true
	}
	seed := time.Now().UnixNano()
	if v := os.Getenv("TASKLEASE_CHAOS_SEED"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("TASKLEASE_CHAOS_SEED=%q: %v", v, err)
		}
		seed = n
	}
	replay := fmt.Sprintf("TASKLEASE_CHAOS_SEED=%d", seed)
	t.Logf("chaos-e2e: seed %d (%s replays the choices), chaos for %v", seed, replay, dur)

	rs := redistest.StartServer(t) // skips without redis-server unless TASKLEASE_REQUIRE_REDIS=1
	dir := t.TempDir()
	bin := buildRunner(t, dir)
	h := newChaosHarness(t, seed, dir, bin, rs)
	// Registered first, so it runs last: nothing a runner started may
	// outlive the test, whatever the build under test does.
	t.Cleanup(func() {
		if n := killMarked(h.nonce, true); n > 0 {
			t.Logf("chaos-e2e: cleanup killed %d leftover processes", n)
		}
		// Runs before the temp dir goes: keep the runners' logs of a
		// failed run (or of any run, with TASKLEASE_CHAOS_LOGS=DIR).
		if keep := os.Getenv("TASKLEASE_CHAOS_LOGS"); keep != "" {
			h.keepLogs(keep)
		} else if t.Failed() {
			h.keepLogs(fmt.Sprintf("%s/tasklease-chaos-e2e-%d", os.TempDir(), seed))
		}
	})
	every := "1s"
	if long && dur > 5*time.Minute {
		every = "2s" // keeps a key's history within historyCap
	}
	h.cfgCron = writeFile(t, dir, "chaos.yaml", chaosConfig(h.rec.srv.URL, true, every))
	h.cfgPlain = writeFile(t, dir, "chaos-nocron.yaml", chaosConfig(h.rec.srv.URL, false, every))
	for _, p := range []string{h.cfgCron, h.cfgPlain} {
		if r := runCmd(t, "validate", "--config", p); r.code != exitOK {
			t.Fatalf("chaos config invalid: %s\n%s", r, mustRead(p))
		}
	}

	for _, id := range h.ids {
		h.start(id, h.cfgCron)
	}
	h.epochs = []*chaosEpoch{{start: h.seedSubjects()}}
	t.Logf("chaos-e2e: %d bulk subjects seeded over %d partitions", len(h.bulk), h.ks.Partitions())

	pollCtx, stopPoll := context.WithCancel(context.Background())
	var pollWG sync.WaitGroup
	pollWG.Go(func() { h.pollState(pollCtx) })
	loadCtx, stopLoad := context.WithCancel(context.Background())
	var loadWG sync.WaitGroup
	for w := range 4 {
		loadWG.Go(func() { h.load(loadCtx, w) })
	}

	h.t0 = time.Now()
	h.faults(dur, long)

	stopLoad()
	loadWG.Wait()
	h.bg.Wait()

	// A deploy without the schedule: every runner stops gracefully (their
	// descendants must go too), then runners without cron drain the keys.
	var wg sync.WaitGroup
	for _, p := range h.current() {
		wg.Go(func() { h.terminate(p) })
	}
	wg.Wait()
	stopPoll()
	pollWG.Wait()
	last := h.epochs[len(h.epochs)-1]
	last.end = h.closeEpoch(last, len(h.epochs)-1)
	for _, id := range h.ids {
		h.start(id, h.cfgPlain)
	}
	// One more exec run per sync key on the runners that stay up: once it
	// has ended, nothing it started may be left (check 3).
	for i, s := range h.syncs {
		cur := h.current()
		if _, err := chaosPost(cur[i%len(cur)].url+taskPath(s, chaosSync)+"/runs", `{"source":"manual"}`, nil); err != nil {
			t.Errorf("submit %s|sync after the deploy: %v", s, err)
		}
	}
	drained, finalStatus := h.drain(map[bool]time.Duration{false: 45 * time.Second, true: 90 * time.Second}[long])
	h.noStageDescendants()
	for _, p := range h.current() {
		wg.Go(func() { h.terminate(p) })
	}
	wg.Wait()
	if ps := scanMarked(h.nonce, true); len(ps) > 0 {
		h.viol.add(checkDescendant, "after every runner stopped, %d processes they started are still alive:\n%s", len(ps), procList(ps))
		killMarked(h.nonce, true)
	}

	final, err := readKeys(context.Background(), h.rdb, h.ks, h.keys)
	if err != nil {
		t.Fatalf("read final state: %v", err)
	}
	last.keys = final
	execLines, err := readExecLog(h.execLog)
	if err != nil {
		t.Fatal(err)
	}
	reqs := h.rec.snapshot()

	h.checkTokens(final, reqs, execLines)
	occurrences, occChecked := 0, 0
	for i, ep := range h.epochs {
		n, c := h.checkOnce(i, ep)
		occurrences, occChecked = occurrences+n, occChecked+c
	}
	execOverlaps := h.checkOverlaps(reqs, execLines)

	// Figures.
	runs := map[string]bool{}
	byOutcome := map[string]int{}
	noKeyHeader := 0
	for _, r := range reqs {
		runs[r.runID] = true
		byOutcome[r.outcome]++
		if !r.keyHeader {
			noKeyHeader++
			h.viol.add(checkTokens, "%s: no Tasklease-Key header naming the key (DESIGN §4)", r.String())
		}
		if !r.headerMatches {
			h.viol.add(checkTokens, "%s: the Tasklease-Fencing-Token header differs from the body's fencingToken", r.String())
		}
	}
	execRuns := 0
	for _, l := range execLines {
		if l.phase == "start" {
			execRuns++
			runs[l.runID] = true
		}
	}
	refused := byOutcome[recRefusedArrival] + byOutcome[recRefusedCommit]
	t.Logf("chaos-e2e: runs=%d kills=%d stops=%d redisRestarts=%d refusedStale=%d occurrences=%d violations=%d",
		len(runs), h.kills.Load(), h.stops.Load(), h.redisRestarts.Load(), refused, occurrences, h.viol.count())
	t.Logf("chaos-e2e: faults: SIGKILL %d (cron leader %d, of them mid-fan-out %d), SIGSTOP>TTL %d, graceful stops %d, Redis restarted empty %d; processes of exec stages alive when their runner died %d, all gone within %v unless reported",
		h.kills.Load(), h.leaderKills.Load(), h.midFanOut.Load(), h.stops.Load(), h.graceful.Load(), h.redisRestarts.Load(), h.descSeen.Load(),
		time.Duration(h.goneMax.Load()).Round(time.Millisecond))
	t.Logf("chaos-e2e: recorder: %d requests, accepted %d, refused stale %d (on arrival %d, at commit %d), aborted by the runner %d, without a Tasklease-Key header %d; peak live per partition %v",
		len(reqs), byOutcome[recAccepted], refused, byOutcome[recRefusedArrival], byOutcome[recRefusedCommit], byOutcome[recAborted], noKeyHeader, h.rec.peaks())
	t.Logf("chaos-e2e: exec: %d stage executions, %d overlapping ones explained by a SIGSTOP or the Redis restart", execRuns, execOverlaps)
	h.mu.Lock()
	t.Logf("chaos-e2e: load: %d submits (%v), %d foreground hooks, %d cancels, %d API errors (runner down or stopped); drained in %v, final statuses %v",
		h.submits.Load(), h.outc, h.fgs.Load(), h.cancels.Load(), h.errs.Load(), drained.Round(time.Millisecond), finalStatus)
	h.mu.Unlock()
	t.Logf("chaos-e2e: cron: %d occurrences fired, %d checked for exactly one request per subject (%d epochs)", occurrences, occChecked, len(h.epochs))
	for _, p := range h.allRunners() {
		errs := p.logErrors()
		for _, l := range errs[:min(5, len(errs))] {
			t.Logf("chaos-e2e: %s#%d logged: %s", p.id, p.inc, l)
		}
		if len(errs) > 5 {
			t.Logf("chaos-e2e: %s#%d logged %d more errors (%s)", p.id, p.inc, len(errs)-5, p.logPath)
		}
	}
	h.viol.report(t, replay)
}

func newChaosHarness(t *testing.T, seed int64, dir, bin string, rs *redistest.Server) *chaosHarness {
	ks, err := keyspace.New(chaosPrefix, 2)
	if err != nil {
		t.Fatal(err)
	}
	h := &chaosHarness{t: t, seed: seed, rng: rand.New(rand.NewPCG(uint64(seed), 1)), dir: dir, bin: bin,
		execLog: dir + "/exec.log", nonce: fmt.Sprintf("chaos%x", rand.Uint64()), rs: rs, rdb: rs.Client(t), ks: ks,
		redisURL: "redis://" + rs.Addr() + "/0", ids: []string{"chaos-a", "chaos-b", "chaos-c"},
		runners: map[string]*chaosRunner{}, outc: map[string]int{}, killed: map[int64]int{}, states: []map[int64]occState{{}},
		stateKey: "{" + chaosPrefix + ":cron:" + chaosSchedule + "}:fanout", leaderKey: chaosPrefix + ":cron:leader"}
	h.rec = newRecorder(t, seed, ks)
	for i := range chaosBulkN {
		h.bulk = append(h.bulk, fmt.Sprintf("u%03d", i))
		h.keys = append(h.keys, taskkey.MustNew(h.bulk[i], chaosBulk))
	}
	for i := range chaosSyncN {
		h.syncs = append(h.syncs, fmt.Sprintf("s%02d", i))
		h.keys = append(h.keys, taskkey.MustNew(h.syncs[i], chaosSync))
	}
	return h
}

// ---------------------------------------------------------------------------
// Checks.

// drain is check 1: with every runner up, each key's run ends (done,
// failed, cancelled, or no record) within timeout.
func (h *chaosHarness) drain(timeout time.Duration) (time.Duration, map[string]int) {
	start := time.Now()
	final := map[string]int{}
	deadline := start.Add(timeout)
	pending := slices.Clone(h.keys)
	views := map[string]jobs.TaskView{}
	var mu sync.Mutex
	for len(pending) > 0 && time.Now().Before(deadline) {
		var still []taskkey.Key
		work := make(chan taskkey.Key)
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Go(func() {
				rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
				for k := range work {
					var v jobs.TaskView
					code, err := chaosGet(h.url(rng)+taskPath(k.Subject(), k.Scope()), &v)
					mu.Lock()
					switch {
					case err != nil || (code != http.StatusOK && code != http.StatusNotFound) || (code == http.StatusOK && v.Status.Active()):
						still = append(still, k)
						views[k.String()] = v
					case code == http.StatusNotFound:
						final["idle"]++
					default:
						final[string(v.Status)]++
					}
					mu.Unlock()
				}
			})
		}
		for _, k := range pending {
			work <- k
		}
		close(work)
		wg.Wait()
		pending = still
		if len(pending) > 0 {
			time.Sleep(300 * time.Millisecond)
		}
	}
	for _, k := range pending {
		v := views[k.String()]
		h.viol.add(checkStuck, "key %s still %s (stage %q, attempt %d/%d, owner %q, token %d, waiting %q, lastError %q) %v after the faults stopped\n%s%s",
			k, v.Status, v.Stage, v.Attempt, v.MaxAttempts, v.Owner, v.FencingToken, v.Waiting, v.LastError, timeout,
			historyLines(context.Background(), h.rdb, h.ks, k, 25), h.rec.lines(k.String(), 8))
	}
	return time.Since(start), final
}

// noStageDescendants is part of check 3: once every run has ended, no
// process started by an exec stage is left, though every runner is alive.
func (h *chaosHarness) noStageDescendants() {
	deadline := time.Now().Add(3 * time.Second)
	for {
		var left []markedProc
		for _, m := range scanMarked(h.nonce, true) {
			if m.key != "" {
				left = append(left, m)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			h.viol.add(checkDescendant, "every run has ended and every runner is alive, yet %d processes started by exec stages are alive:\n%s",
				len(left), procList(left))
			for _, m := range left {
				_ = syscall.Kill(m.pid, syscall.SIGKILL)
			}
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// checkTokens is check 2: in each epoch the grant tokens of a key's history
// strictly increase; every token granted after the Redis restart is above
// every token seen for the key before it.
func (h *chaosHarness) checkTokens(final map[string]*keyData, reqs []recReq, lines []execLine) {
	ctx := context.Background()
	for i, ep := range h.epochs {
		keys := ep.keys
		if i == len(h.epochs)-1 {
			keys = final
		}
		for _, k := range h.keys {
			d := keys[k.String()]
			if d == nil {
				continue
			}
			for j := 1; j < len(d.grants); j++ {
				if a, b := d.grants[j-1], d.grants[j]; b.token <= a.token {
					h.viol.add(checkTokens, "key %s (epoch %d): grant token %d (%s run %s at %s) after %d (%s run %s): tokens went backwards\n%s",
						k, i+1, b.token, b.event, b.runID, time.UnixMilli(b.at).Format("15:04:05.000"), a.token, a.event, a.runID,
						historyLines(ctx, h.rdb, h.ks, k, 25))
				}
			}
			for _, g := range d.grants {
				if g.token <= 0 || g.token >= 1<<53 {
					h.viol.add(checkTokens, "key %s: grant token %d is not a positive JSON-safe integer", k, g.token)
				}
			}
		}
	}
	if h.redisUp.IsZero() {
		return
	}
	// Before the data loss: every token the recorder, the exec log, the
	// history or the key's fence, lease and record showed.
	preMax, known := map[string]int64{}, map[string]map[int64]bool{}
	note := func(key string, tok int64) {
		if tok <= 0 {
			return
		}
		if known[key] == nil {
			known[key] = map[int64]bool{}
		}
		known[key][tok] = true
		preMax[key] = max(preMax[key], tok)
	}
	for key, d := range h.epochs[0].keys {
		for _, tok := range d.tokens() {
			note(key, tok)
		}
	}
	for _, r := range reqs {
		if r.arrive.Before(h.redisUp) {
			note(r.key, r.token)
		}
	}
	for _, l := range lines {
		if l.at.Before(h.redisUp) {
			note(l.key, l.token)
		}
	}
	up := h.redisUp.Format("15:04:05.000")
	for _, k := range h.keys {
		key := k.String()
		d := final[key]
		if d == nil {
			continue
		}
		for _, g := range d.grants {
			if g.token <= preMax[key] {
				h.viol.add(checkTokens, "key %s: token %d granted after the Redis restart (%s, %s run %s at %s) is not above token %d seen before it; its recorder requests around the restart:\n%s",
					key, g.token, up, g.event, g.runID, time.UnixMilli(g.at).Format("15:04:05.000"), preMax[key],
					h.rec.around(key, h.redisUp, 4))
				break
			}
		}
	}
	for _, r := range reqs {
		if r.arrive.After(h.redisUp) && r.token <= preMax[r.key] && !known[r.key][r.token] && !r.refused() {
			h.viol.add(checkTokens, "%s: token arrived after the Redis restart (%s), was never granted before it, and is not above token %d seen before it\n%s",
				r.String(), up, preMax[r.key], h.rec.lines(r.key, 8))
		}
	}
	for _, l := range lines {
		if l.phase == "start" && l.at.After(h.redisUp) && l.token <= preMax[l.key] && !known[l.key][l.token] {
			h.viol.add(checkTokens, "exec stage of %s run %s started at %s with token %d after the Redis restart (%s); token %d was seen before it",
				l.key, l.runID, l.at.Format("15:04:05.000"), l.token, up, preMax[l.key])
		}
	}
}

// checkOnce is check 4 for one epoch: every occurrence's fan-out is
// claimed only after the previous one finished, so the requests of the
// occurrences claimed at c1 < c2 < … fall into [c1, c2), [c2, c3), …. In
// each such bucket inside the epoch's window every bulk subject must have
// exactly as many schedule requests as occurrences were claimed in it (an
// occurrence whose claim the poller missed shares its predecessor's
// bucket). It returns the occurrences fired and those checked.
func (h *chaosHarness) checkOnce(i int, ep *chaosEpoch) (fired, checked int) {
	type bucket struct {
		occs       []int64
		start, end int64
	}
	var bs []*bucket
	var cur *bucket
	for _, o := range ep.fired {
		if st, ok := ep.states[o]; ok && st.startedAt > 0 {
			cur = &bucket{occs: []int64{o}, start: st.startedAt}
			bs = append(bs, cur)
			if st.abandoned {
				h.viol.add(checkOnce, "epoch %d: occurrence %s was abandoned unfinished (%d submitted): its remaining subjects got no request",
					i+1, time.Unix(o, 0).Format("15:04:05"), st.submitted)
			}
		} else if cur != nil {
			cur.occs = append(cur.occs, o)
		}
	}
	// An occurrence the poller never saw finished (or that finished in the
	// millisecond the next was claimed: a resumed fan-out is followed at
	// once by the catch-up occurrence) has no sharp end: check it together
	// with the next one.
	merged := bs[:0]
	for _, b := range bs {
		if n := len(merged); n > 0 {
			prev := merged[n-1]
			if st, ok := ep.states[prev.occs[len(prev.occs)-1]]; !ok || !st.done || st.finishedAt >= b.start {
				prev.occs = append(prev.occs, b.occs...)
				continue
			}
		}
		merged = append(merged, b)
	}
	bs = merged
	for j, b := range bs {
		b.end = ep.end
		if j+1 < len(bs) {
			b.end = bs[j+1].start
		}
	}
	var check []*bucket
	for j, b := range bs {
		if b.start < ep.start || b.end > ep.end {
			continue
		}
		if j == len(bs)-1 { // the last one must be finished within the window
			st, ok := ep.states[b.occs[len(b.occs)-1]]
			if !ok || !st.done || st.finishedAt > ep.end {
				continue
			}
		}
		check = append(check, b)
		checked += len(b.occs)
	}
	fired = len(ep.fired)
	interrupted, interruptedChecked := 0, 0
	h.mu.Lock()
	for occ, e := range h.killed {
		if e != i {
			continue
		}
		interrupted++
		for _, b := range check {
			if slices.Contains(b.occs, occ) {
				interruptedChecked++
			}
		}
	}
	h.mu.Unlock()
	h.t.Logf("chaos-e2e: epoch %d: window %s..%s, %d occurrences fired, %d buckets, %d occurrences checked × %d subjects; %d fan-outs interrupted by a leader kill, %d of them checked",
		i+1, time.UnixMilli(ep.start).Format("15:04:05.000"), time.UnixMilli(ep.end).Format("15:04:05.000"),
		fired, len(bs), checked, len(h.bulk), interrupted, interruptedChecked)
	fmtOccs := func(b *bucket) string {
		var s []string
		for _, o := range b.occs {
			s = append(s, time.Unix(o, 0).Format("15:04:05"))
		}
		return fmt.Sprintf("occurrence(s) %v claimed in [%s, %s)", s,
			time.UnixMilli(b.start).Format("15:04:05.000"), time.UnixMilli(b.end).Format("15:04:05.000"))
	}
	// Repeats of a run's schedule joins are coalesced into one event (count,
	// first and last time): its requests are spread over the buckets they
	// span, one per occurrence, oldest first. (Within one coalesced span a
	// double request for one occurrence and none for the next cannot be told
	// apart; every other miscount can.)
	bucketOf := func(at int64) int {
		for i, b := range bs {
			if at >= b.start && at < b.end {
				return i
			}
		}
		return -1
	}
	counts := map[string][]int64{} // subject → requests per checked bucket
	spans := map[string][]string{}
	for _, s := range h.bulk {
		d := ep.keys[taskkey.MustNew(s, chaosBulk).String()]
		c := make([]int64, len(bs))
		counts[s] = c
		if d == nil {
			continue
		}
		for _, r := range d.sched {
			first, last := bucketOf(r.at), bucketOf(r.last)
			spans[s] = append(spans[s], fmt.Sprintf("%s..%s %s/%s ×%d", time.UnixMilli(r.at).Format("15:04:05.000"),
				time.UnixMilli(r.last).Format("15:04:05.000"), r.event, r.outcome, r.count))
			// A span may start before the epoch's first bucket or go on after
			// its last: the requests outside the window are not this
			// epoch's to count.
			before, after := len(bs) > 0 && r.at < bs[0].start, len(bs) > 0 && r.last >= bs[len(bs)-1].end
			if first < 0 && last < 0 && !(before && after) {
				continue
			}
			if first < 0 {
				first = 0
			}
			if last < 0 {
				last = len(bs) - 1
			}
			// Fill the buckets the requests span, up to one request per
			// occurrence each: oldest first, or newest first when the span
			// began before the window. What is left over is dropped when
			// the span goes past the window on that side; otherwise it stays
			// in the edge bucket (and fails the check there).
			idx := make([]int, 0, last-first+1)
			for i := first; i <= last; i++ {
				idx = append(idx, i)
			}
			drop := after
			if before && !after {
				slices.Reverse(idx)
				drop = true
			}
			left := r.count
			for n, i := range idx {
				take := min(left, int64(len(bs[i].occs))-c[i])
				if n == len(idx)-1 && !drop {
					take = left
				}
				if take > 0 {
					c[i] += take
					left -= take
				}
			}
		}
	}
	for _, b := range check {
		bi := slices.Index(bs, b)
		wrong := map[int64][]string{}
		for _, s := range h.bulk {
			d := ep.keys[taskkey.MustNew(s, chaosBulk).String()]
			if d != nil && d.events >= chaosHistoryCap && d.first > b.start {
				continue // trimmed: the history no longer covers the bucket
			}
			if n := counts[s][bi]; n != int64(len(b.occs)) {
				wrong[n] = append(wrong[n], fmt.Sprintf("%s %v", s, spans[s]))
			}
		}
		for n, subjects := range wrong {
			h.viol.add(checkOnce, "epoch %d, %s: %d subject(s) got %d schedule request(s), want %d: %s",
				i+1, fmtOccs(b), len(subjects), n, len(b.occs), strings.Join(subjects[:min(6, len(subjects))], "; "))
		}
	}
	return fired, checked
}

// checkOverlaps is check 5: at the recorder no execution of a key overlaps
// another one unless the older (lower token) one was refused or given up;
// in the exec log an execution that ended after a newer one of its key
// started is only explained by its runner being stopped, or by the Redis
// restart. It returns the explained exec overlaps.
func (h *chaosHarness) checkOverlaps(reqs []recReq, lines []execLine) int {
	byKey := map[string][]recReq{}
	for _, r := range reqs {
		byKey[r.key] = append(byKey[r.key], r)
	}
	for key, l := range byKey {
		sort.Slice(l, func(a, b int) bool { return l[a].arrive.Before(l[b].arrive) })
		for a := range l {
			for b := a + 1; b < len(l) && !l[a].end.IsZero() && l[b].arrive.Before(l[a].end); b++ {
				lo, hi := l[a], l[b]
				if hi.token < lo.token {
					lo, hi = hi, lo
				}
				if lo.outcome == recAccepted && lo.end.After(hi.arrive) {
					h.viol.add(checkOverlap, "%s: two executions overlap and the older one was accepted:\n  %s\n  %s\n%s",
						key, lo.String(), hi.String(), h.rec.lines(key, 10))
				}
			}
		}
	}

	type execRun struct {
		start, end *execLine
	}
	runs := map[string]*execRun{} // key token run
	var order []string
	for i := range lines {
		l := &lines[i]
		id := fmt.Sprintf("%s %d %s", l.key, l.token, l.runID)
		e := runs[id]
		if e == nil {
			e = &execRun{}
			runs[id] = e
			order = append(order, id)
		}
		switch l.phase {
		case "start":
			if e.start != nil {
				h.viol.add(checkOverlap, "exec stage of %s run %s token %d started twice (%s and %s)", l.key, l.runID, l.token,
					e.start.at.Format("15:04:05.000"), l.at.Format("15:04:05.000"))
			}
			e.start = l
		case "end":
			e.end = l
		}
	}
	h.mu.Lock()
	stops := slices.Clone(h.stopLog)
	h.mu.Unlock()
	explained := 0
	perKey := map[string][]*execRun{}
	for _, id := range order {
		if e := runs[id]; e.start != nil {
			perKey[e.start.key] = append(perKey[e.start.key], e)
		}
	}
	for key, l := range perKey {
		for _, a := range l {
			if a.end == nil {
				continue
			}
			for _, b := range l {
				if b == a || b.start.token <= a.start.token || !b.start.at.After(a.start.at) || !b.start.at.Before(a.end.at) {
					continue
				}
				why := ""
				for _, s := range stops {
					if s.marker == a.start.marker && s.from.Before(b.start.at) && s.to.After(a.start.at) {
						why = "its runner was SIGSTOPped"
					}
				}
				if !h.redisUp.IsZero() && h.redisDown.Before(b.start.at) && h.redisUp.After(a.start.at.Add(-time.Second)) {
					why = "Redis restarted empty"
				}
				if why != "" {
					explained++
					continue
				}
				h.viol.add(checkOverlap, "%s: exec stage token %d (%s, %s..%s) was still running when token %d (%s) started at %s",
					key, a.start.token, a.start.marker, a.start.at.Format("15:04:05.000"), a.end.at.Format("15:04:05.000"),
					b.start.token, b.start.marker, b.start.at.Format("15:04:05.000"))
			}
		}
	}
	return explained
}
