//go:build linux

// Check 8: a paused scope's runs are never granted. While the faults run,
// the sync scope is paused and resumed now and then through random
// runners' APIs; no lease of a sync key may be granted between the moment
// a pause was answered and the moment its resume was sent.

package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"time"
)

// pauseSpan is one pause of the sync scope: Redis time from just after the
// pause was answered to just before the resume was sent, and the same in
// wall time (to compare with the Redis faults).
type pauseSpan struct {
	from, to         int64 // Redis ms
	fromWall, toWall time.Time
}

// pauser pauses the sync scope for 0.4–1.5 s every 2–5 s until ctx ends,
// and always resumes what it paused before it returns.
func (h *harness) pauser(ctx context.Context) {
	rng := rand.New(rand.NewPCG(uint64(h.seed), 99))
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(2000+rng.IntN(3000)) * time.Millisecond):
		}
		if !h.scopeCall(ctx, rng, "pause") {
			continue // no runner answered: nothing is paused for sure — or it is, and resume below undoes it
		}
		from, err := redisNowMs(ctx, h.rdb)
		span := pauseSpan{from: from, fromWall: time.Now()}
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(400+rng.IntN(1100)) * time.Millisecond):
		}
		// The resume must happen even when the load has stopped, or the
		// drain finds the scope's keys waiting (check 1).
		rctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		to, terr := redisNowMs(rctx, h.rdb)
		span.to, span.toWall = to, time.Now()
		if !h.scopeCall(rctx, rng, "resume") {
			h.viol.add(checkPause, "could not resume scope %s through any runner within 30 s", syncScope)
		}
		cancel()
		if err == nil && terr == nil {
			h.mu.Lock()
			h.pauseSpans = append(h.pauseSpans, span)
			h.mu.Unlock()
		}
	}
}

// scopeCall POSTs /v1/scopes/sync/<action> to random runners until one
// answers 200 (or ctx ends).
func (h *harness) scopeCall(ctx context.Context, rng *rand.Rand, action string) bool {
	for ctx.Err() == nil {
		if code, err := h.post(h.url(rng)+"/v1/scopes/"+syncScope+"/"+action, "", nil); err == nil && code == http.StatusOK {
			return true
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
	return false
}

// checkPause is check 8 over every epoch's history of the sync keys. A
// pause that overlaps a Redis fault is not checked: the pause is state in
// Redis, and data loss or a failover may lose it like any other write.
func (h *harness) checkPause(final map[string]*keyData) int {
	h.mu.Lock()
	spans := append([]pauseSpan(nil), h.pauseSpans...)
	h.mu.Unlock()
	datas := []map[string]*keyData{final}
	for _, ep := range h.epochs {
		datas = append(datas, ep.keys)
	}
	checked := 0
	seen := map[string]bool{}
	for _, sp := range spans {
		if h.faultDuring(sp.fromWall, sp.toWall) || h.lagDuring(sp.from, sp.to) {
			continue
		}
		checked++
		for _, keys := range datas {
			for key, d := range keys {
				if !isSyncKey(key) {
					continue
				}
				for _, g := range d.grants {
					id := fmt.Sprintf("%s %d", key, g.token)
					if g.at > sp.from && g.at < sp.to && !seen[id] {
						seen[id] = true
						h.viol.add(checkPause, "key %s: lease granted (%s, token %d, run %s) at %s while scope %s was paused (%s .. %s)",
							key, g.event, g.token, g.runID, time.UnixMilli(g.at).UTC().Format("15:04:05.000"), syncScope,
							time.UnixMilli(sp.from).UTC().Format("15:04:05.000"), time.UnixMilli(sp.to).UTC().Format("15:04:05.000"))
					}
				}
			}
		}
	}
	return checked
}

// faultDuring reports whether a Redis fault (until Redis served again, plus
// a second) overlaps [from, to].
func (h *harness) faultDuring(from, to time.Time) bool {
	for _, o := range h.outages {
		end := o.up
		if s := o.down.Add(o.serving); s.After(end) {
			end = s
		}
		if o.down.Before(to) && end.Add(time.Second).After(from) {
			return true
		}
	}
	return false
}

// lagDuring reports whether Redis times [from, to] (ms) are among those a
// lagging clock showed after a Redis fault: a grant then dated inside them
// may have come seconds later by the host's clock.
func (h *harness) lagDuring(from, to int64) bool {
	for _, o := range h.outages {
		if o.lag > 0 && from <= o.up.UnixMilli()+1000 && to >= o.down.Add(-o.lag-time.Second).UnixMilli() {
			return true
		}
	}
	return false
}

func isSyncKey(key string) bool {
	return len(key) > len(syncScope)+1 && key[len(key)-len(syncScope)-1:] == "|"+syncScope
}
