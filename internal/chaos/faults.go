//go:build linux

// The fault schedule and the faults.

package chaos

import (
	"context"
	"maps"
	"strconv"
	"syscall"
	"time"
)

// faults runs the fault schedule for dur: runners SIGKILLed (the cron
// leader mid-fan-out now and then) and restarted, runners SIGSTOPped past
// their lease TTL, and Redis restarted empty once.
func (h *harness) faults(dur time.Duration, long bool) {
	start := time.Now()
	end := start.Add(dur)
	restartAt := start.Add(dur * 4 / 10)
	if long {
		restartAt = start.Add(dur / 2)
	}
	nextLeader := start.Add(3 * time.Second)
	leaderEvery := max(30*time.Second, dur/8)
	nextRandom := start.Add(time.Duration(1500+h.rng.IntN(1500)) * time.Millisecond)
	restarted := false
	var lastCont time.Time // the end of the latest SIGSTOP
	pendingOcc := ""       // a fan-out left unfinished by a killed leader
	for time.Now().Before(end) {
		now := time.Now()
		// A killed leader's successor takes over after the leader TTL
		// (10 s) and resumes the fan-out: the Redis restart waits for that
		// (at most 10 s), so the resume is checked, and no SIGSTOPped
		// runner's late writes straddle the data loss.
		resumed := pendingOcc == "" || h.fanOutFinished(pendingOcc)
		switch {
		case !restarted && !now.Before(restartAt) && now.After(lastCont.Add(2*time.Second)) &&
			(resumed || now.After(restartAt.Add(10*time.Second))):
			h.restartRedis()
			restarted, pendingOcc = true, ""
			nextRandom = time.Now().Add(2 * time.Second)
		case !now.Before(nextLeader) && now.Before(end.Add(-15*time.Second)) &&
			(restarted && now.After(h.redisUp.Add(2*time.Second)) || !restarted && (h.leaderKills.Load() == 0 || now.Before(restartAt.Add(-15*time.Second)))):
			if occ := h.killLeader(); occ != "" {
				pendingOcc = occ
			}
			nextLeader = nextLeader.Add(leaderEvery)
		case !now.Before(nextRandom):
			cur := h.current()
			p := cur[h.rng.IntN(len(cur))]
			if h.rng.IntN(2) == 0 {
				h.kill(p)
			} else {
				h.stop(p, time.Duration(1500+h.rng.IntN(1500))*time.Millisecond)
				lastCont = time.Now()
			}
			nextRandom = time.Now().Add(time.Duration(1500+h.rng.IntN(2000)) * time.Millisecond)
		default:
			time.Sleep(50 * time.Millisecond)
		}
	}
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
	m, _ := h.rdb.HGetAll(ctx, h.stateKey).Result()
	h.stMu.Lock()
	if st, ok := parseOccState(m); ok {
		h.states[i][st.occ] = st
	}
	ep.states = maps.Clone(h.states[i])
	h.stMu.Unlock()
	return now
}

// restartRedis snapshots what the checker needs from before the data loss,
// makes Redis lose its data, and seeds the bulk subjects again.
func (h *harness) restartRedis() {
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
	h.redisDown = time.Now()
	h.topo.restartEmpty(t, time.Duration(500+h.rng.IntN(500))*time.Millisecond)
	h.redisUp = time.Now()
	h.redisRestarts.Add(1)
	h.epochs = append(h.epochs, &epoch{start: h.seedSubjects()})
	h.logf("Redis restarted empty (down %v); subjects seeded again in %v",
		h.redisUp.Sub(h.redisDown).Round(time.Millisecond), time.Since(h.redisUp).Round(time.Millisecond))
}
