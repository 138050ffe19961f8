//go:build linux

// The checks of a run, but check 4 (once.go).

package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/tasklease/tasklease/jobs"
	"github.com/tasklease/tasklease/taskkey"
)

// drain is check 1: with every runner up, each key's run ends (done,
// failed, cancelled, or no record) within timeout.
func (h *harness) drain(timeout time.Duration) (time.Duration, map[string]int) {
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
					code, err := h.get(h.url(rng)+taskPath(k.Subject(), k.Scope()), &v)
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
		extra := ""
		if k.Scope() == limitedScope {
			extra = h.limitedState(context.Background(), k)
		}
		h.viol.add(checkStuck, "key %s still %s (stage %q, attempt %d/%d, owner %q, token %d, waiting %q, lastError %q) %v after the faults stopped\n%s%s%s",
			k, v.Status, v.Stage, v.Attempt, v.MaxAttempts, v.Owner, v.FencingToken, v.Waiting, v.LastError, timeout,
			historyLines(context.Background(), h.rdb, h.ks, k, 25), h.rec.lines(k.String(), 8), extra)
	}
	return time.Since(start), final
}

// noStageDescendants is part of check 3: once every run has ended, no
// process started by an exec stage is left, though every runner is alive.
func (h *harness) noStageDescendants() {
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
func (h *harness) checkTokens(final map[string]*keyData, reqs []recReq, lines []execLine) {
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
	for i, o := range h.outages {
		h.checkTokensAcross(i, o, final, reqs, lines)
	}
}

// checkTokensAcross checks that every token granted after Redis fault i
// began is above every token seen for the key before it: the fence holds
// across restarts, lost disks and failovers that lost writes.
func (h *harness) checkTokensAcross(i int, o outage, final map[string]*keyData, reqs []recReq, lines []execLine) {
	// Before the fault: every token the recorder, the exec log, the
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
	for _, ep := range h.epochs[:i+1] {
		for key, d := range ep.keys {
			for _, tok := range d.tokens() {
				note(key, tok)
			}
		}
	}
	for _, r := range reqs {
		if r.arrive.Before(o.down) {
			note(r.key, r.token)
		}
	}
	for _, l := range lines {
		if l.at.Before(o.down) {
			note(l.key, l.token)
		}
	}
	at := o.down.Format("15:04:05.000")
	// Grants by Redis time: after a lagging promotion Redis time is up to
	// the lag behind the host's, so a grant after the fault may be dated
	// before it; one dated within the lag before it is after it unless
	// its token was seen before the fault.
	downMs, lagMs := o.down.UnixMilli(), o.down.Add(-o.lag).UnixMilli()
	for _, k := range h.keys {
		key := k.String()
		d := final[key]
		if d == nil {
			continue
		}
		for _, g := range d.grants {
			after := g.at > downMs || g.at > lagMs && !known[key][g.token]
			if after && g.token <= preMax[key] {
				h.viol.add(checkTokens, "key %s: token %d granted after the Redis fault %s (%s; %s run %s at %s) is not above token %d seen before it; its recorder requests around the fault:\n%s",
					key, g.token, o.kind, at, g.event, g.runID, time.UnixMilli(g.at).Format("15:04:05.000"), preMax[key],
					h.rec.around(key, o.down, 4))
				break
			}
		}
	}
	for _, r := range reqs {
		if r.arrive.After(o.down) && r.token <= preMax[r.key] && !known[r.key][r.token] && !r.refused() {
			h.viol.add(checkTokens, "%s: token arrived after the Redis fault %s (%s), was never granted before it, and is not above token %d seen before it\n%s",
				r.String(), o.kind, at, preMax[r.key], h.rec.lines(r.key, 8))
		}
	}
	for _, l := range lines {
		if l.phase == "start" && l.at.After(o.down) && l.token <= preMax[l.key] && !known[l.key][l.token] {
			h.viol.add(checkTokens, "exec stage of %s run %s started at %s with token %d after the Redis fault %s (%s); token %d was seen before it",
				l.key, l.runID, l.at.Format("15:04:05.000"), l.token, o.kind, at, preMax[l.key])
		}
	}
}

// checkOverlaps is check 5: at the recorder no execution of a key overlaps
// another one unless the older (lower token) one was refused or given up;
// in the exec log an execution that ended after a newer one of its key
// started is only explained by its runner being stopped, or by the Redis
// restart. It returns the explained exec overlaps.
func (h *harness) checkOverlaps(reqs []recReq, lines []execLine) int {
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
					switch {
					case s.marker == a.start.marker && s.from.Before(b.start.at) && s.to.After(a.start.at):
						why = "its runner was SIGSTOPped"
					case s.marker == "" && s.from.Before(b.start.at) && s.to.After(a.start.at):
						why = "Redis was paused past the lease TTL"
					}
				}
				for _, o := range h.outages {
					// a fault that lost the lease (a restart, a failover
					// before replication) lets a second holder start
					if o.down.Before(b.start.at) && o.up.After(a.start.at.Add(-time.Second)) {
						why = "a Redis fault (" + o.kind + ")"
					}
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

// checkRedisFaults is check 0: every Redis fault of the run is one the
// harness made. The other checks forgive data loss only at the faults they
// know of; a failover of the Sentinels' own (a primary stalled past
// down-after-milliseconds) loses writes where they expect none.
func (h *harness) checkRedisFaults(ctx context.Context) {
	what, err := h.topo.unplanned(ctx)
	switch {
	case err != nil:
		h.viol.add(checkFaults, "could not count the Redis faults: %v", err)
	case what != "":
		h.viol.add(checkFaults, "%s: data may have been lost where the checks do not expect it, so violations of other checks may be Redis's, not tasklease's", what)
	}
}
