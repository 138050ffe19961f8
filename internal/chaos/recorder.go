//go:build linux

package chaos

import (
	"encoding/json"
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
}

const (
	recAccepted       = "accepted"
	recRefusedArrival = "refused-arrival"
	recRefusedCommit  = "refused-commit"
	recAborted        = "aborted"
)

func (r *recReq) refused() bool {
	return r.outcome == recRefusedArrival || r.outcome == recRefusedCommit
}

func (r *recReq) String() string {
	end := "-"
	if !r.end.IsZero() {
		end = r.end.Format("15:04:05.000")
	}
	return fmt.Sprintf("recorder %s token %d run %s attempt %d: %s..%s %s",
		r.key, r.token, r.runID, r.attempt, r.arrive.Format("15:04:05.000"), end, r.outcome)
}

// recorder answers the bulk job's http stage like a downstream that checks
// fencing tokens: per key it remembers the highest token it has seen; a
// request with a lower one is refused with 409 when it arrives, and a
// request that is still being held when a higher token arrives is refused
// when it would commit (the write of a deposed holder). Every request is
// held 0.2–2 s (seeded), so hundreds of runs are live at once.
type recorder struct {
	ks  *keyspace.Space
	srv *http.Server
	url string // http://127.0.0.1:PORT

	mu      sync.Mutex
	rng     *rand.Rand
	highest map[string]int64
	reqs    []*recReq
	byKey   map[string][]*recReq
	live    []int // requests being held, per partition
	peak    []int
}

// newRecorder starts a recorder on a loopback port; it is closed at t's
// cleanup.
func newRecorder(t redistest.T, seed int64, ks *keyspace.Space) *recorder {
	t.Helper()
	r := &recorder{ks: ks, rng: rand.New(rand.NewPCG(uint64(seed), 0x7265636f7264)),
		highest: map[string]int64{}, byKey: map[string][]*recReq{},
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

	r.mu.Lock()
	// A request arrives when its token is seen, under the lock that orders
	// it against commits: timed before (at the connection, or before the
	// body was decoded), a request could look as if it arrived before an
	// older one that committed first, an overlap the downstream never had.
	rr.arrive = time.Now()
	r.reqs = append(r.reqs, rr)
	r.byKey[rr.key] = append(r.byKey[rr.key], rr)
	hold := 200*time.Millisecond + time.Duration(r.rng.Int64N(int64(1800*time.Millisecond)))
	if rr.token < r.highest[rr.key] {
		rr.outcome, rr.end = recRefusedArrival, time.Now()
		r.mu.Unlock()
		http.Error(w, "stale fencing token", http.StatusConflict)
		return
	}
	r.highest[rr.key] = rr.token
	r.live[part]++
	r.peak[part] = max(r.peak[part], r.live[part])
	r.mu.Unlock()

	timer := time.NewTimer(hold)
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-req.Context().Done(): // the runner gave up (lease lost, cancel, kill)
		r.mu.Lock()
		r.live[part]--
		rr.outcome, rr.end = recAborted, time.Now()
		r.mu.Unlock()
		return
	}
	r.mu.Lock()
	r.live[part]--
	if rr.token < r.highest[rr.key] {
		rr.outcome, rr.end = recRefusedCommit, time.Now()
		r.mu.Unlock()
		http.Error(w, "stale fencing token", http.StatusConflict)
		return
	}
	rr.outcome, rr.end = recAccepted, time.Now()
	r.mu.Unlock()
	w.WriteHeader(http.StatusOK)
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
