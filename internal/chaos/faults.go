//go:build linux

// The fault schedule and the faults.

package chaos

import (
	"context"
	"fmt"
	"maps"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/tasklease/tasklease/jobs"
	"github.com/tasklease/tasklease/taskkey"
)

// faults runs the fault schedule for dur: runners SIGKILLed (the cron
// leader mid-fan-out now and then) and restarted, runners SIGSTOPped past
// their lease TTL, Redis paused past the TTL, and the topology's Redis
// faults (restarts, failovers; one, the last, in a run under 40 s) spread
// over the run.
func (h *harness) faults(dur time.Duration, long bool) {
	start := time.Now()
	end := start.Add(dur)
	planned := h.topo.dataFaults()
	if dur < 40*time.Second {
		planned = planned[len(planned)-1:]
	}
	faultAt := func(i int) time.Time {
		if len(planned) == 1 {
			if long {
				return start.Add(dur / 2)
			}
			return start.Add(dur * 4 / 10)
		}
		return start.Add(dur * time.Duration(i+1) / time.Duration(len(planned)+1))
	}
	next := 0 // index of the next Redis fault
	nextLeader := start.Add(3 * time.Second)
	leaderEvery := max(30*time.Second, dur/8)
	nextRandom := start.Add(time.Duration(1500+h.rng.IntN(1500)) * time.Millisecond)
	burstAt, burstDone := start.Add(dur/5), len(h.bursts) == 0
	var lastCont time.Time // the end of the latest SIGSTOP or CLIENT PAUSE
	pendingOcc := ""       // a fan-out left unfinished by a killed leader
	for time.Now().Before(end) {
		now := time.Now()
		// A killed leader's successor takes over after the leader TTL
		// (10 s) and resumes the fan-out: a Redis fault waits for that (at
		// most 10 s), so the resume is checked, and no SIGSTOPped runner's
		// late writes straddle a data loss.
		resumed := pendingOcc == "" || h.fanOutFinished(pendingOcc)
		var lastUp time.Time
		if len(h.outages) > 0 {
			lastUp = h.outages[len(h.outages)-1].up
		}
		switch {
		case !burstDone && !now.Before(burstAt) && now.After(lastCont.Add(2*time.Second)):
			h.execBurst()
			burstDone = true
			nextRandom = time.Now().Add(2 * time.Second)
		case next < len(planned) && !now.Before(faultAt(next)) && now.After(lastCont.Add(2*time.Second)) &&
			(resumed || now.After(faultAt(next).Add(10*time.Second))):
			h.redisFault(planned[next])
			next++
			pendingOcc = ""
			nextRandom = time.Now().Add(2 * time.Second)
		case !now.Before(nextLeader) && now.Before(end.Add(-15*time.Second)) && (lastUp.IsZero() || now.After(lastUp.Add(2*time.Second))) &&
			(next == len(planned) || h.leaderKills.Load() == 0 || now.Before(faultAt(next).Add(-15*time.Second))):
			if occ := h.killLeader(); occ != "" {
				pendingOcc = occ
			}
			nextLeader = nextLeader.Add(leaderEvery)
		case !now.Before(nextRandom):
			cur := h.current()
			p := cur[h.rng.IntN(len(cur))]
			switch r := h.rng.IntN(5); {
			case r < 2:
				h.kill(p)
			case r < 4:
				// Freeze a holder of the limited job's slots when one is
				// writing: its slots expire and go to waiting runs, and
				// its late writes must be refused (check 9).
				if q := h.byMarker(h.rec.limitedHolder()); q != nil {
					p = q
				}
				h.stop(p, time.Duration(1500+h.rng.IntN(1500))*time.Millisecond)
				lastCont = time.Now()
			default:
				h.pauseRedis(time.Duration(1200+h.rng.IntN(800)) * time.Millisecond)
				lastCont = time.Now()
			}
			nextRandom = time.Now().Add(time.Duration(1500+h.rng.IntN(2000)) * time.Millisecond)
		default:
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// clockLagHold is how long the node a Redis fault brought up serves on
// its lagging clock before it steps forward to the true time.
const clockLagHold = 3 * time.Second

// pauseRedis runs CLIENT PAUSE for d and waits until it has ended: no
// runner can renew meanwhile, and leases expire as it ends.
func (h *harness) pauseRedis(d time.Duration) {
	from := time.Now()
	if err := h.topo.pause(h.t, context.Background(), h.rng, d); err != nil {
		h.logf("CLIENT PAUSE failed: %v", err)
		return
	}
	time.Sleep(d)
	h.pauses.Add(1)
	h.mu.Lock()
	h.stopLog = append(h.stopLog, stopSpan{from: from, to: time.Now()})
	h.mu.Unlock()
	h.logf("Redis paused for %v", d)
}

// fanOutFinished reports whether the fan-out of occurrence occ is done
// (or a later occurrence has been claimed since).
func (h *harness) fanOutFinished(occ string) bool {
	st, err := h.rdb.HMGet(context.Background(), h.stateKey, "occ", "done").Result()
	if err != nil || len(st) != 2 {
		return false
	}
	return st[0] != occ || st[1] == "1"
}

// stop SIGSTOPs p for d (longer than the lease TTL), then SIGCONTs it.
func (h *harness) stop(p *runnerProc, d time.Duration) {
	from := time.Now()
	_ = p.cmd.Process.Signal(syscall.SIGSTOP)
	h.stops.Add(1)
	h.logf("SIGSTOP %s#%d for %v", p.id, p.inc, d.Round(time.Millisecond))
	time.Sleep(d)
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	h.mu.Lock()
	h.stopLog = append(h.stopLog, stopSpan{marker: p.marker, from: from, to: time.Now()})
	h.mu.Unlock()
}

// killLeader SIGKILLs the cron leader, while a fan-out is in progress when
// it can catch one (occurrences are on whole seconds), and restarts it. It
// returns the occurrence of the fan-out it interrupted, if it did.
func (h *harness) killLeader() string {
	ctx := context.Background()
	var target *runnerProc
	for deadline := time.Now().Add(5 * time.Second); target == nil && time.Now().Before(deadline); {
		v, _ := h.rdb.Get(ctx, h.leaderKey).Result()
		for _, p := range h.current() {
			if v != "" && p.schedOwner() == v {
				target = p
			}
		}
		if target == nil {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if target == nil {
		h.note("no live cron leader found; killing a random runner instead")
		cur := h.current()
		h.kill(cur[h.rng.IntN(len(cur))])
		return ""
	}
	// Every other time, wait until the fan-out has recorded its first
	// batch, so the successor resumes from a cursor past the start.
	past := h.leaderKills.Load()%2 == 1
	caught := false
	for try := 0; try < 4 && !caught; try++ {
		// Wake up just before the next whole second, then watch the state.
		next := time.Now().Truncate(time.Second).Add(time.Second - 15*time.Millisecond)
		time.Sleep(time.Until(next))
		for until := time.Now().Add(400 * time.Millisecond); time.Now().Before(until); {
			v, err := h.rdb.HMGet(ctx, h.stateKey, "done", "batches").Result()
			if err == nil && len(v) == 2 && v[0] == "0" && (!past || v[1] != "0" && v[1] != nil) {
				caught = true
				break
			}
		}
	}
	_ = target.cmd.Process.Signal(syscall.SIGKILL)
	<-target.done
	h.kills.Add(1)
	h.leaderKills.Add(1)
	st, _ := h.rdb.HMGet(ctx, h.stateKey, "occ", "done", "part", "submitted").Result()
	mid := len(st) == 4 && st[1] == "0"
	if len(st) != 4 {
		st = make([]any, 4)
	}
	if mid {
		h.midFanOut.Add(1)
	}
	h.logf("killed cron leader %s#%d (fan-out in progress: %v, state occ=%v part=%v submitted=%v)",
		target.id, target.inc, mid, st[0], st[2], st[3])
	h.bg.Go(func() { h.checkGone(target, "SIGKILL (cron leader)") })
	time.Sleep(time.Duration(200+h.rng.IntN(500)) * time.Millisecond)
	h.start(target.id, h.cfgCron)
	if !mid {
		return ""
	}
	occ, _ := st[0].(string)
	if n, err := strconv.ParseInt(occ, 10, 64); err == nil {
		h.mu.Lock()
		h.killed[n] = len(h.epochs) - 1
		h.mu.Unlock()
	}
	return occ
}

// closeEpoch reads what epoch i fired and returns the Redis time it ends.
func (h *harness) closeEpoch(ep *epoch, i int) int64 {
	ctx := context.Background()
	now, err := redisNowMs(ctx, h.rdb)
	if err != nil {
		h.t.Fatalf("chaos: %v", err)
	}
	if ep.fired, err = firedOccurrences(ctx, h.rdb, keyPrefix, scheduleName); err != nil {
		h.t.Fatalf("chaos: fired occurrences: %v", err)
	}
	sts, err := h.readOccStates(ctx)
	if err != nil { // the poller's view stands
		h.note("epoch %d: reading the fan-out states at its end: %v", i+1, err)
	}
	h.stMu.Lock()
	maps.Copy(h.states[i], sts)
	ep.states = maps.Clone(h.states[i])
	h.stMu.Unlock()
	return now
}

// redisFault snapshots what the checker needs from before a Redis fault,
// makes it happen (data may be lost), and seeds the bulk subjects again.
func (h *harness) redisFault(kind string) {
	t := h.t
	ep := h.epochs[len(h.epochs)-1]
	ep.end = h.closeEpoch(ep, len(h.epochs)-1)
	var err error
	if ep.keys, err = readKeys(context.Background(), h.rdb, h.ks, h.keys); err != nil {
		t.Fatalf("chaos: snapshot before the Redis restart: %v", err)
	}
	h.stMu.Lock()
	h.states = append(h.states, map[int64]occState{})
	h.stMu.Unlock()
	o := outage{kind: kind, down: time.Now()}
	down := time.Duration(500+h.rng.IntN(500)) * time.Millisecond
	if h.clockFaults {
		o.lag = ClockLagMin + time.Duration(h.rng.Int64N(int64(ClockLagMax-ClockLagMin)))
		h.clockLags.Add(1)
	}
	serving := h.topo.dataFault(t, kind, h.rng, down, o.lag)
	if o.lag > 0 {
		// The lagging clock serves for a while, then steps forward to
		// the true time (NTP catching up): the leases it granted end
		// early by the lag, as a clock that jumps does. The fault's
		// window, the checks' excuse for data loss, ends after the step.
		time.Sleep(clockLagHold)
		for _, n := range h.topo.clockNodes() {
			if err := n.Clock().Set(0); err != nil {
				t.Fatalf("chaos: clock back: %v", err)
			}
		}
	}
	o.up, o.serving = time.Now(), serving
	h.outages = append(h.outages, o)
	h.epochs = append(h.epochs, &epoch{start: h.seedSubjects()})
	lagged := ""
	if o.lag > 0 {
		lagged = fmt.Sprintf(", its clock %v behind the one before", o.lag.Round(time.Millisecond))
	}
	h.logf("Redis fault %s%s: serving again after %v; subjects seeded again in %v",
		kind, lagged, serving.Round(time.Millisecond), time.Since(o.up).Round(time.Millisecond))
	if o.lag > 0 {
		h.logf("clocks stepped forward to the true time %v after serving again", clockLagHold)
	}
}

// execBurst makes the burst job's stages live at once (Options.ExecBurst),
// waits until nine in ten run (at most 15 s), and SIGKILLs the runner
// holding most of them: its supervisors must clean up hundreds of stages at
// once without starving the other runners (kill checks that nothing of it
// is left after 5 s; the checks at the end, that no lease was broken).
func (h *harness) execBurst() {
	n, cur := len(h.bursts), h.current()
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < n; i += 8 {
				sent := time.Now()
				var res jobs.SubmitResult
				if _, err := h.post(cur[i%len(cur)].url+taskPath(h.bursts[i], burstScope)+"/runs", `{"source":"manual"}`, &res); err != nil {
					h.errs.Add(1)
					continue
				}
				h.acc.submit(taskkey.MustNew(h.bursts[i], burstScope), sent, res)
				h.submits.Add(1)
			}
		})
	}
	wg.Wait()
	// Strike when nine in ten run, or when their number stopped growing for
	// a second (on a loaded host the first ones end before the last start).
	deadline := time.Now().Add(15 * time.Second)
	var victim *runnerProc
	held, running, best, grew := 0, 0, 0, time.Now()
	for {
		perRunner := map[string]int{}
		for _, m := range scanMarked(h.nonce, true) { // one scan for every runner
			if m.cmdline == "sleep 5" {
				perRunner[m.marker]++
			}
		}
		victim, held, running = nil, 0, 0
		for _, p := range h.current() {
			c := perRunner[p.marker]
			running += c
			if c > held {
				victim, held = p, c
			}
		}
		if running > best {
			best, grew = running, time.Now()
		}
		if running >= n*9/10 || (running > 0 && time.Since(grew) > time.Second) || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if victim == nil {
		h.note("exec burst: none of %d stages started within 15s", n)
		return
	}
	h.burstRunning, h.burstHeld = running, held
	h.logf("exec burst: %d of %d stages running, %s#%d holds %d: SIGKILL", running, n, victim.id, victim.inc, held)
	h.kill(victim)
}
