//go:build linux

package chaos

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/keyspace"
	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/taskkey"
)

const (
	scheduleName = "chaos-bulk"
	keyPrefix    = "tasklease"
	bulkScope    = "bulk"
	syncScope    = "sync"
	burstScope   = "burst"
	limitedScope = "limited"
	limiterName  = "remote" // the limiter the limited job holds a slot of
	historyCap   = 2000
	partitions   = 2
	syncN        = 12 // subjects of the sync job
)

// epoch is one stretch of the run without Redis data loss: the cron
// occurrences fired in it and the keys' state at its end.
type epoch struct {
	start, end int64 // checked window (Redis ms): subjects seeded .. Redis lost or cron stopped
	fired      []int64
	states     map[int64]occState
	keys       map[string]*keyData
}

// outage is one Redis fault: Redis went down (or lost writes) at down and
// served again at up; it ends an epoch.
type outage struct {
	kind     string
	down, up time.Time
	serving  time.Duration // until Redis served again (a failover: the promotion), as the topology measured it
	lag      time.Duration // how far the clock of the node serving after it lags the one before (0: none)
}

// stopSpan is a SIGSTOP of one runner incarnation (or, with marker "", a
// CLIENT PAUSE of Redis).
type stopSpan struct {
	marker   string
	from, to time.Time
}

// harness is one run: what it started, what it did, what it found.
type harness struct {
	t                       redistest.T
	logfn                   func(format string, args ...any)
	seed                    int64
	rng                     *rand.Rand // fault schedule; main goroutine only
	dir, bin, execLog       string
	cfgCron, cfgPlain       string
	nonce                   string
	topo                    topology
	rdb                     redis.UniversalClient
	ks                      *keyspace.Space
	rec                     *recorder
	http                    *http.Client // the load's and the checker's: a stopped runner must not hang them
	viol                    violations
	bulk, syncs, bursts     []string
	limited                 []string // subjects of the limited job
	limit                   int      // the concurrency of limiterName
	keys                    []taskkey.Key
	ids                     []string
	outages                 []outage // the Redis faults, in order (main goroutine, then the checks)
	epochs                  []*epoch
	bg                      sync.WaitGroup
	t0                      time.Time
	stateKey, leaderKey     string
	recentKey               string // the schedule's recent fan-outs (archived states)
	kills, leaderKills      atomic.Int64
	midFanOut, stops, errs  atomic.Int64
	graceful, descSeen      atomic.Int64
	goneMax                 atomic.Int64 // longest wait for a dead runner's processes to go (ns)
	burstRunning, burstHeld int          // the exec burst: stages running when it was struck, on the killed runner
	submits, cancels        atomic.Int64
	fgs, pauses             atomic.Int64
	pauseSpans              []pauseSpan // the sync scope's pauses (check 8), under mu
	logsKept                string      // where the logs were copied, once they were
	acc                     acceptLog   // the load's accepted submits and cancels (check 6)
	net                     *network    // nil: no network faults
	netFaults               []string    // the kinds to make (Options.NetFaults)
	clockFaults             bool        // every Redis fault brings up a lagging clock (Options.NoClockFaults)
	clockLags               atomic.Int64

	mu      sync.Mutex
	runners map[string]*runnerProc
	all     []*runnerProc
	incs    int
	stopLog []stopSpan
	netMade map[string]int // network faults made, by kind
	outc    map[string]int
	killed  map[int64]int // occurrences whose fan-out a leader kill interrupted → epoch

	stMu   sync.Mutex
	states []map[int64]occState // per epoch, from the poller
}

// Run is one chaos soak (see the package doc): it starts the topology's
// Redis, the recorder and opts.Runners runner processes, seeds the
// subjects, runs load and faults for opts.Duration, deploys the runners
// again without the schedule, drains, checks, and returns the report.
// Violations are counted in the report; the caller decides what they mean.
// Run returns an error for bad options or when it cannot complete; setup
// failures may also call t.Fatalf, and a missing redis-server calls t.Skip
// (unless TASKLEASE_REQUIRE_REDIS=1). Everything it started is stopped by
// t's cleanups. It calls t's methods from the calling goroutine only.
func Run(t redistest.T, opts Options) (Report, error) {
	t.Helper()
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return Report{}, fmt.Errorf("chaos: %w", err)
	}
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	topo, err := newTopology(t, opts)
	if err != nil {
		return Report{}, fmt.Errorf("chaos: %w", err)
	}
	h, err := newHarness(t, opts, topo)
	if err != nil {
		return Report{}, fmt.Errorf("chaos: %w", err)
	}
	rep, err := h.run(opts)
	if err != nil {
		return rep, fmt.Errorf("chaos: %w", err)
	}
	return rep, nil
}

func newHarness(t redistest.T, opts Options, topo topology) (*harness, error) {
	ks, err := keyspace.New(keyPrefix, partitions)
	if err != nil {
		return nil, fmt.Errorf("keyspace: %w", err)
	}
	dir := t.TempDir()
	h := &harness{t: t, logfn: opts.Logf, seed: opts.Seed, rng: rand.New(rand.NewPCG(uint64(opts.Seed), 1)),
		limit: opts.Limit, dir: dir, bin: opts.RunnerBin, execLog: dir + "/exec.log", nonce: fmt.Sprintf("chaos%x", rand.Uint64()),
		topo: topo, rdb: topo.client(), ks: ks, http: &http.Client{Timeout: 3 * time.Second},
		runners: map[string]*runnerProc{}, netMade: map[string]int{}, outc: map[string]int{}, killed: map[int64]int{}, states: []map[int64]occState{{}},
		stateKey: "{" + keyPrefix + ":cron:" + scheduleName + "}:fanout", leaderKey: keyPrefix + ":cron:leader",
		recentKey: "{" + keyPrefix + ":cron:" + scheduleName + "}:fanouts"}
	for i := range opts.Runners {
		h.ids = append(h.ids, fmt.Sprintf("chaos-%c", 'a'+i))
	}
	h.rec = newRecorder(t, opts.Seed, ks)
	h.clockFaults = !opts.NoClockFaults
	if len(opts.NetFaults) > 0 {
		h.net, h.netFaults = newNetwork(topo.dataNodes()), opts.NetFaults
		t.Cleanup(h.net.close)
	}
	for i := range opts.Keys {
		h.bulk = append(h.bulk, fmt.Sprintf("u%03d", i))
		h.keys = append(h.keys, taskkey.MustNew(h.bulk[i], bulkScope))
	}
	for i := range syncN {
		h.syncs = append(h.syncs, fmt.Sprintf("s%02d", i))
		h.keys = append(h.keys, taskkey.MustNew(h.syncs[i], syncScope))
	}
	for i := range limitedN {
		h.limited = append(h.limited, fmt.Sprintf("l%02d", i))
		h.keys = append(h.keys, taskkey.MustNew(h.limited[i], limitedScope))
	}
	for i := range max(opts.ExecBurst, 0) {
		h.bursts = append(h.bursts, fmt.Sprintf("b%03d", i))
		h.keys = append(h.keys, taskkey.MustNew(h.bursts[i], burstScope))
	}
	return h, nil
}

// run is Run once the harness is set up.
func (h *harness) run(opts Options) (Report, error) {
	t := h.t
	begin := time.Now()
	dur, long := opts.Duration, opts.long()
	// Registered first, so it runs last: nothing a runner started may
	// outlive the run, whatever the build under test does.
	t.Cleanup(func() {
		if n := killMarked(h.nonce, true); n > 0 {
			h.note("cleanup killed %d leftover processes", n)
		}
		// Runs before the temp dir goes: keep the runners' logs of a run
		// that failed before it could keep them itself.
		if h.logsKept != "" {
			return
		}
		if dir := h.logsDir(opts, t.Failed()); dir != "" {
			if err := h.keepLogs(dir); err != nil {
				h.note("%v", err)
			}
		}
	})
	every := "1s"
	if long && dur > 5*time.Minute {
		every = "2s" // keeps a key's history within historyCap
	}
	var err error
	if h.cfgCron, err = h.writeConfig("chaos.yaml", runnerConfig(h.rec.url, true, every, h.limit)); err != nil {
		return Report{}, err
	}
	if h.cfgPlain, err = h.writeConfig("chaos-nocron.yaml", runnerConfig(h.rec.url, false, every, h.limit)); err != nil {
		return Report{}, err
	}

	for _, id := range h.ids {
		h.start(id, h.cfgCron)
	}
	h.epochs = []*epoch{{start: h.seedSubjects()}}
	h.note("%d bulk subjects seeded over %d partitions", len(h.bulk), h.ks.Partitions())

	pollCtx, stopPoll := context.WithCancel(context.Background())
	var pollWG sync.WaitGroup
	pollWG.Go(func() { h.pollState(pollCtx) })
	loadCtx, stopLoad := context.WithCancel(context.Background())
	var loadWG sync.WaitGroup
	for w := range 4 {
		loadWG.Go(func() { h.load(loadCtx, w) })
	}
	loadWG.Go(func() { h.pauser(loadCtx) })

	h.t0 = time.Now()
	netCtx, stopNet := context.WithCancel(context.Background())
	var netWG sync.WaitGroup
	if h.net != nil {
		netWG.Go(func() { h.netFaultLoop(netCtx) })
	}
	h.faults(dur, long)
	stopNet()
	netWG.Wait()

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
		if _, err := h.post(cur[i%len(cur)].url+taskPath(s, syncScope)+"/runs", `{"source":"manual"}`, nil); err != nil {
			h.viol.add(checkDescendant, "submit %s|sync after the deploy (check 3 needs its run): %v", s, err)
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
		return Report{}, fmt.Errorf("read final state: %w", err)
	}
	last.keys = final
	execLines, err := readExecLog(h.execLog)
	if err != nil {
		return Report{}, err
	}
	reqs := h.rec.snapshot()

	h.checkRedisFaults(context.Background())
	h.checkTokens(final, reqs, execLines)
	occurrences, occChecked := 0, 0
	for i, ep := range h.epochs {
		n, c := h.checkOnce(i, ep)
		occurrences, occChecked = occurrences+n, occChecked+c
	}
	execOverlaps := h.checkOverlaps(reqs, execLines)
	acceptedChecked := h.checkAccepted()
	rerunChecked := h.checkRerun(reqs, execLines)
	pausesChecked := h.checkPause(final)
	lim := h.checkLimit(reqs)
	hist := h.checkHistories()

	// Figures.
	runs := map[string]bool{}
	byOutcome := map[string]int{}
	noKeyHeader := 0
	for _, r := range reqs {
		runs[r.runID] = true
		byOutcome[r.outcome]++
		if !r.keyHeader {
			noKeyHeader++
			h.viol.add(checkTokens, "%s: no Tasklease-Key header naming the key (docs/stages.md)", r.String())
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
	kills, leader, mid := int(h.kills.Load()), int(h.leaderKills.Load()), int(h.midFanOut.Load())
	rep := Report{
		Topology: h.topo.name(), Seed: h.seed, DurationSeconds: dur.Seconds(),
		Runners: len(h.ids), Keys: len(h.bulk), SyncKeys: len(h.syncs), Partitions: h.ks.Partitions(),
		Runs: len(runs),
		FaultsByKind: map[string]int{
			FaultSigkill:                kills - leader,
			FaultSigkillLeader:          leader - mid,
			FaultSigkillLeaderMidFanOut: mid,
			FaultSigstopPastTTL:         int(h.stops.Load()),
			FaultGracefulStop:           int(h.graceful.Load()),
			FaultClientPause:            int(h.pauses.Load()),
		},
		RefusedStale: byOutcome[recRefusedArrival] + byOutcome[recRefusedCommit],
		Occurrences:  occurrences, OccurrencesChecked: occChecked, Epochs: len(h.epochs),
		BurstStages: h.burstRunning, BurstStagesOnKilled: h.burstHeld,
		DescendantsSeen: int(h.descSeen.Load()),
		GoneMaxSeconds:  time.Duration(h.goneMax.Load()).Round(time.Millisecond).Seconds(),
		Requests:        len(reqs), Accepted: byOutcome[recAccepted],
		RefusedOnArrival: byOutcome[recRefusedArrival], RefusedAtCommit: byOutcome[recRefusedCommit],
		Aborted: byOutcome[recAborted], NoKeyHeader: noKeyHeader, PeakLivePerPartition: h.rec.peaks(),
		ExecRuns: execRuns, ExecOverlapsExplained: execOverlaps, AcceptedChecked: acceptedChecked,
		RerunChecked: rerunChecked, PausesChecked: pausesChecked,
		Limit: h.limit, LimitedKeys: len(h.limited), LimitedWrites: lim.writes, LimitedAccepted: lim.accepted,
		LimitedExecutions: lim.executions, MaxAcceptedConcurrency: lim.maxConcurrent,
		SecondsAtLimit:    math.Round(lim.atLimit*10) / 10,
		RefusedLateWrites: lim.refusedLate, RefusedLateAfterStop: lim.refusedAfterStop,
		RefusedLateAfterPause: lim.refusedAfterPause, LimitedRefusedByKey: lim.refusedByKey,
		LimitedAborted: lim.aborted, SlotTokensBehindFaults: lim.behindFaults, RefusedBehindFaults: lim.refusedBehind,
		SlotTokensBehindExample: lim.behindExample, SlotTokensTwice: lim.tokensTwice, SlotTokensTwiceExample: lim.tokensTwiceExample,
		HistoryOps: hist.ops, HistoryRuns: hist.runs, HistoryRunsNearFaults: hist.excludedRuns,
		HistoryUnconfirmed: hist.unconfirmed, HistoryVerdict: string(hist.verdict),
		Submits: int(h.submits.Load()), ForegroundHooks: int(h.fgs.Load()), Cancels: int(h.cancels.Load()),
		APIErrors:    int(h.errs.Load()),
		DrainSeconds: drained.Round(time.Millisecond).Seconds(), FinalStatuses: finalStatus,
	}
	takeovers := map[string]bool{}
	for _, ep := range h.epochs {
		for key, d := range ep.keys {
			for _, g := range d.grants {
				if g.event == "recovered" {
					takeovers[fmt.Sprintf("%s %d", key, g.token)] = true
				}
			}
		}
	}
	rep.Takeovers = len(takeovers)
	rep.RedisFaults = []RedisFault{}
	h.mu.Lock()
	for k, n := range h.netMade {
		rep.FaultsByKind[k] += n
	}
	h.mu.Unlock()
	for _, o := range h.outages {
		rep.FaultsByKind[o.kind]++
		rep.RedisFaults = append(rep.RedisFaults, RedisFault{Kind: o.kind, AtSeconds: o.down.Sub(h.t0).Round(100 * time.Millisecond).Seconds(),
			ServingAfterSeconds: o.serving.Round(time.Millisecond).Seconds(), ClockLagSeconds: o.lag.Round(time.Millisecond).Seconds()})
	}
	for _, n := range rep.FaultsByKind {
		rep.Faults += n
	}
	h.mu.Lock()
	rep.SubmitOutcomes = h.outc
	h.mu.Unlock()
	rep.RunnerLogErrors = []string{}
	for _, p := range h.allRunners() {
		errs := p.logErrors()
		for _, l := range errs[:min(5, len(errs))] {
			rep.RunnerLogErrors = append(rep.RunnerLogErrors, fmt.Sprintf("%s#%d logged: %s", p.id, p.inc, l))
		}
		if len(errs) > 5 {
			rep.RunnerLogErrors = append(rep.RunnerLogErrors, fmt.Sprintf("%s#%d logged %d more errors (%s)", p.id, p.inc, len(errs)-5, p.logPath))
		}
	}
	rep.Violations, rep.ViolationsByCheck, rep.Details = h.viol.count(), h.viol.byCheck(), h.viol.details()
	if dir := h.logsDir(opts, rep.Violations > 0); dir != "" {
		if err := h.keepLogs(dir); err != nil {
			h.note("%v", err)
		} else {
			h.logsKept, rep.LogsDir = dir, dir
		}
	}
	rep.ElapsedSeconds = time.Since(begin).Round(time.Millisecond).Seconds()
	return rep, nil
}

// logsDir is where the runners' logs go: opts.KeepLogs, or when the run
// failed $TMPDIR/tasklease-chaos-e2e-<seed>; "" keeps none.
func (h *harness) logsDir(opts Options, failed bool) string {
	switch {
	case opts.KeepLogs != "":
		return opts.KeepLogs
	case failed:
		return filepath.Join(os.TempDir(), fmt.Sprintf("tasklease-chaos-e2e-%d", h.seed))
	}
	return ""
}

// logf logs a fault with its time since the chaos began.
func (h *harness) logf(format string, args ...any) {
	h.t.Helper()
	h.note("+%5.1fs "+format, append([]any{time.Since(h.t0).Seconds()}, args...)...)
}

// note logs a progress line.
func (h *harness) note(format string, args ...any) {
	h.t.Helper()
	h.logfn(format, args...)
}
