//go:build linux

package chaos

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tasklease/tasklease/internal/keyspace"
	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/jobs"
	"github.com/tasklease/tasklease/taskkey"
)

// recReq is one request the recorder saw.
type recReq struct {
	key, runID    string
	token         int64
	attempt       int
	arrive, end   time.Time
	outcome       string // accepted | refused-arrival | refused-commit | aborted
	keyHeader     bool   // the request carried Tasklease-Key
	headerMatches bool   // Tasklease-Fencing-Token equals the body's fencingToken

	// The limited job's requests (limitedPath) only.
	limited   bool
	stage     string
	slotsText string     // the Tasklease-Limiter-Slots header as sent
	slots     []slotHeld // parsed from it (nil when it does not parse)
	runner    string     // limitedRunnerHeader: the runner incarnation's marker
	bySlot    bool       // refused by the slot fence (a newer holder of its slot wrote)
}

// slotHeld is one limiter slot a request says its run holds.
type slotHeld struct {
	limiter string
	slot    int
	token   int64
}

// fenceKey is the slot's key at the downstream, "<limiter>#<slot>"
// (docs/flow-control.md).
func (s slotHeld) fenceKey() string { return s.limiter + "#" + strconv.Itoa(s.slot) }

// parseSlots parses a Tasklease-Limiter-Slots header, "name:slot:token,...".
func parseSlots(v string) ([]slotHeld, error) {
	if v == "" {
		return nil, errors.New("no Tasklease-Limiter-Slots header")
	}
	var out []slotHeld
	for f := range strings.SplitSeq(v, ",") {
		p := strings.Split(f, ":")
		if len(p) != 3 {
			return nil, fmt.Errorf("slot %q: want name:slot:token", f)
		}
		slot, err1 := strconv.Atoi(p[1])
		tok, err2 := strconv.ParseInt(p[2], 10, 64)
		if p[0] == "" || err1 != nil || err2 != nil {
			return nil, fmt.Errorf("slot %q: want name:slot:token", f)
		}
		out = append(out, slotHeld{limiter: p[0], slot: slot, token: tok})
	}
	return out, nil
}

const (
	recAccepted       = "accepted"
	recRefusedArrival = "refused-arrival"
	recRefusedCommit  = "refused-commit"
	recAborted        = "aborted"
)

// The limited job's route at the recorder, and the header its requests
// name their runner incarnation in (set in the runners' config from
// CHAOS_RUNNER).
const (
	limitedPath         = "/limited"
	limitedRunnerHeader = "X-Chaos-Runner"
)

// How long the recorder holds a write of the limited job: limitedHoldMin
// plus up to limitedHoldSpread (seeded).
const (
	limitedHoldMin    = 400 * time.Millisecond
	limitedHoldSpread = time.Second
)

func (r *recReq) refused() bool {
	return r.outcome == recRefusedArrival || r.outcome == recRefusedCommit
}

func (r *recReq) String() string {
	end := "-"
	if !r.end.IsZero() {
		end = r.end.Format("15:04:05.000")
	}
	s := fmt.Sprintf("recorder %s token %d run %s attempt %d: %s..%s %s",
		r.key, r.token, r.runID, r.attempt, r.arrive.Format("15:04:05.000"), end, r.outcome)
	if r.limited {
		by := ""
		if r.bySlot {
			by = " by the slot fence"
		}
		s += fmt.Sprintf("%s (stage %s, slots %q, runner %s)", by, r.stage, r.slotsText, r.runner)
	}
	return s
}

// recorder answers the bulk and limited jobs' http stages like a
// downstream that checks fencing tokens: per key it remembers the highest
// token it has seen; a request with a lower one is refused with 409 when
// it arrives, and a request that is still being held when a higher token
// arrives is refused when it would commit (the write of a deposed holder).
// A request of the limited job is fenced the same way by each limiter
// slot it holds, "<limiter>#<slot>" with the slot's token: its write is
// accepted only if its slot token is at least the highest seen for that
// slot, on arrival and at commit (the write of a holder whose slot
// expired and went to someone else who wrote is refused). Every bulk
// request is held 0.2–2 s (seeded), so hundreds of runs are live at once;
// a limited one 0.4–1.4 s, twice a run (two stages), so a run holds its
// limiter slot for about two seconds and the load keeps every slot busy.
type recorder struct {
	ks  *keyspace.Space
	srv *http.Server
	url string // http://127.0.0.1:PORT

	mu          sync.Mutex
	rng         *rand.Rand
	highest     map[string]int64
	slotHighest map[string]int64 // "<limiter>#<slot>" → highest slot token seen
	reqs        []*recReq
	byKey       map[string][]*recReq
	live        []int // requests being held, per partition
	peak        []int
	liveLimited map[string]int // the limited job's requests being held, by runner marker
}

// newRecorder starts a recorder on a loopback port; it is closed at t's
// cleanup.
func newRecorder(t redistest.T, seed int64, ks *keyspace.Space) *recorder {
	t.Helper()
	r := &recorder{ks: ks, rng: rand.New(rand.NewPCG(uint64(seed), 0x7265636f7264)),
		highest: map[string]int64{}, slotHighest: map[string]int64{}, byKey: map[string][]*recReq{}, liveLimited: map[string]int{},
		live: make([]int, ks.Partitions()), peak: make([]int, ks.Partitions())}
	ln, err := net.Listen("tcp", "127.0.0.1:0") // 127.0.0.1 only
	if err != nil {
		t.Fatalf("chaos: recorder: %v", err)
	}
	r.srv = &http.Server{Handler: r, ReadHeaderTimeout: 10 * time.Second}
	r.url = "http://" + ln.Addr().String()
	go func() { _ = r.srv.Serve(ln) }()
	t.Cleanup(func() { _ = r.srv.Close() })
	return r
}

func (r *recorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	var body struct {
		Key          string `json:"key"`
		RunID        string `json:"runId"`
		Stage        string `json:"stage"`
		Attempt      int    `json:"attempt"`
		FencingToken int64  `json:"fencingToken"`
	}
	if err := json.NewDecoder(req.Body).Decode(&body); err != nil || body.Key == "" {
		http.Error(w, "bad body", http.StatusBadRequest)
		return
	}
	hdrTok, _ := strconv.ParseInt(req.Header.Get("Tasklease-Fencing-Token"), 10, 64)
	part := 0
	if k, err := taskkey.Parse(body.Key); err == nil {
		part = r.ks.Partition(k)
	}
	rr := &recReq{key: body.Key, runID: body.RunID, token: body.FencingToken, attempt: body.Attempt,
		keyHeader: req.Header.Get("Tasklease-Key") == body.Key, headerMatches: hdrTok == body.FencingToken}
	if req.URL.Path == limitedPath {
		rr.limited, rr.stage, rr.runner = true, body.Stage, req.Header.Get(limitedRunnerHeader)
		rr.slotsText = req.Header.Get(jobs.HTTPLimiterSlotsHeader)
		rr.slots, _ = parseSlots(rr.slotsText) // a request without valid slots is accepted by key only; check 9 reports it
	}

	r.mu.Lock()
	// A request arrives when its token is seen, under the lock that orders
	// it against commits: timed before (at the connection, or before the
	// body was decoded), a request could look as if it arrived before an
	// older one that committed first, an overlap the downstream never had.
	rr.arrive = time.Now()
	r.reqs = append(r.reqs, rr)
	r.byKey[rr.key] = append(r.byKey[rr.key], rr)
	var hold time.Duration
	if rr.limited {
		hold = limitedHoldMin + time.Duration(r.rng.Int64N(int64(limitedHoldSpread)))
	} else {
		hold = 200*time.Millisecond + time.Duration(r.rng.Int64N(int64(1800*time.Millisecond)))
	}
	if stale, bySlot := r.stale(rr); stale {
		rr.outcome, rr.end, rr.bySlot = recRefusedArrival, time.Now(), bySlot
		r.mu.Unlock()
		http.Error(w, "stale fencing token", http.StatusConflict)
		return
	}
	r.highest[rr.key] = rr.token
	for _, s := range rr.slots {
		r.slotHighest[s.fenceKey()] = s.token
	}
	r.live[part]++
	r.peak[part] = max(r.peak[part], r.live[part])
	if rr.limited {
		r.liveLimited[rr.runner]++
	}
	r.mu.Unlock()

	timer := time.NewTimer(hold)
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-req.Context().Done(): // the runner gave up (lease lost, cancel, kill)
		r.mu.Lock()
		r.live[part]--
		if rr.limited {
			r.liveLimited[rr.runner]--
		}
		rr.outcome, rr.end = recAborted, time.Now()
		r.mu.Unlock()
		return
	}
	r.mu.Lock()
	r.live[part]--
	if rr.limited {
		r.liveLimited[rr.runner]--
	}
	if stale, bySlot := r.stale(rr); stale {
		rr.outcome, rr.end, rr.bySlot = recRefusedCommit, time.Now(), bySlot
		r.mu.Unlock()
		http.Error(w, "stale fencing token", http.StatusConflict)
		return
	}
	rr.outcome, rr.end = recAccepted, time.Now()
	r.mu.Unlock()
	w.WriteHeader(http.StatusOK)
}

// limitedHolder returns the marker of the runner incarnation with the
// most of the limited job's writes being held, "" when there are none.
func (r *recorder) limitedHolder() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	best, n := "", 0
	for m, c := range r.liveLimited {
		if c > n || c == n && m < best {
			best, n = m, c
		}
	}
	return best
}

// stale reports whether rr's write must be refused: a higher token has
// been seen for its key, or for one of its limiter slots (bySlot: and not
// for its key). r.mu is held.
func (r *recorder) stale(rr *recReq) (stale, bySlot bool) {
	if rr.token < r.highest[rr.key] {
		return true, false
	}
	for _, s := range rr.slots {
		if s.token < r.slotHighest[s.fenceKey()] {
			return true, true
		}
	}
	return false, false
}

// snapshot returns copies of every request (finished or not).
func (r *recorder) snapshot() []recReq {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]recReq, len(r.reqs))
	for i, rr := range r.reqs {
		out[i] = *rr
	}
	return out
}

// lines describes key's last n requests.
func (r *recorder) lines(key string, n int) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.byKey[key]
	var b strings.Builder
	for _, rr := range l[max(0, len(l)-n):] {
		b.WriteString("  " + rr.String() + "\n")
	}
	if b.Len() == 0 {
		return "  (no recorder requests)\n"
	}
	return b.String()
}

// around describes up to n of key's requests on each side of t.
func (r *recorder) around(key string, t time.Time, n int) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.byKey[key]
	i := sort.Search(len(l), func(i int) bool { return l[i].arrive.After(t) })
	var b strings.Builder
	for _, rr := range l[max(0, i-n):min(len(l), i+n)] {
		b.WriteString("  " + rr.String() + "\n")
	}
	if b.Len() == 0 {
		return "  (no recorder requests)\n"
	}
	return b.String()
}

func (r *recorder) peaks() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.peak)
}
