package main

import (
	"bytes"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/tasklease/tasklease/internal/apptoken/apptokentest"
	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/jobs"
)

// subjectStreamsEnv sizes TestSubjectStreamsAtScale: the number of subject
// streams one runner holds open at once (its http.maxSubjectStreams).
const subjectStreamsEnv = "TASKLEASE_SUBJECT_STREAMS"

// subjectStreamsIdleEnv, a Go duration, adds a window in which the streams
// are open and nothing changes, to measure what idle streams cost the
// runner's CPU (a keep-alive comment every 15 s each). Off by default.
const subjectStreamsIdleEnv = "TASKLEASE_SUBJECT_STREAMS_IDLE"

// TestSubjectStreamsAtScale opens N concurrent subject streams
// (GET /v1/subjects/{subject}/events, each with its own subject token) on
// one `runner serve` process, N = TASKLEASE_SUBJECT_STREAMS (default
// 1,000), which is also the runner's http.maxSubjectStreams: the test runs
// at the cap, and one stream more must be refused.
//
// Phases: (A) a handful of streams open while runs are submitted for K
// subjects, a few of them watched; (B) the other streams open (N in all:
// one per subject, three for each of five subjects); the streams of A's
// unwatched subjects must get their current state on connect; K more
// subjects' runs are submitted, all watched.
//
// It asserts isolation (no stream ever receives another subject's view;
// a subject that never changed receives nothing), delivery (every stream
// of a changed subject receives its run's final state, every stream of a
// multi-stream subject too), current state on connect, the cap, and that
// the runner holds one pub/sub connection to Redis whatever N (opening
// the N streams sends no SUBSCRIBE beyond the hub's liveness probes). It logs what it measures — memory
// and goroutines per stream, delivery latency with a handful of streams
// open and with all N, the runner's CPU — and asserts none of it.
func TestSubjectStreamsAtScale(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads the runner's /proc entries")
	}
	if testing.Short() {
		t.Skip("builds the binary and opens many streams")
	}
	n := 1000
	if s := os.Getenv(subjectStreamsEnv); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v < 100 {
			t.Fatalf("%s=%q: want a number of streams, at least 100", subjectStreamsEnv, s)
		}
		n = v
	}
	// Each process (this one, the runner) holds a descriptor per stream,
	// and Go raises its soft limit to the hard one.
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	if lim.Max < uint64(n)+1000 {
		t.Fatalf("%d streams need %d open files in this process and in the runner; the hard limit (ulimit -Hn) is %d",
			n, n+1000, lim.Max)
	}
	var idle time.Duration
	if s := os.Getenv(subjectStreamsIdleEnv); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d < 0 {
			t.Fatalf("%s=%q: want a duration", subjectStreamsIdleEnv, s)
		}
		idle = d
	}

	const (
		scope       = "app_sync"
		multi       = 5  // subjects with several streams
		multiEach   = 3  // streams of each of them
		handful     = 50 // streams open in phase A
		submitRate  = 200
		openWorkers = 64 // streams being opened at once
	)
	subjectCount := n - multi*(multiEach-1)
	k := min(1000, subjectCount/2) // changed subjects per phase

	rs := redistest.StartServer(t)
	rdb := rs.Client(t)
	dir := t.TempDir()
	bin := buildRunner(t, dir)

	// The job's one stage is an HTTP POST to this process: a run goes
	// queued → running → done in a few milliseconds, without a process.
	var stageCalls atomic.Int64
	stageSrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		stageCalls.Add(1)
	}))
	t.Cleanup(stageSrv.Close)

	secret := []byte(strings.Repeat("s", 40))
	const operator = "scale-operator-token"
	cfgText := fmt.Sprintf(`
runner:
  id: "${TASKLEASE_RUNNER_ID}"
  leaseTTL: 10s
  shutdownGrace: 2s
  concurrency: 32
log:
  level: warn
http:
  token: %q
  subjectTokens: {hmacSecret: %q}
  maxSubjectStreams: %d
jobs:
  %s:
    retry: {maxAttempts: 1}
    stages:
      - name: pushing
        http: {url: %q}
`, operator, secret, n, scope, stageSrv.URL)
	cfgPath := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfgText), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startRunner(t, bin, cfgPath, "redis://"+rs.Addr()+"/0", "scale")
	host := strings.TrimPrefix(p.url, "http://")
	pid := p.cmd.Process.Pid

	subjects := make([]string, subjectCount)
	for i := range subjects {
		subjects[i] = fmt.Sprintf("u%05d", i)
	}
	rng := rand.New(rand.NewPCG(1, uint64(n)))
	perm := rng.Perm(subjectCount)
	pick := func(idx []int) []string {
		out := make([]string, len(idx))
		for i, j := range idx {
			out[i] = subjects[j]
		}
		return out
	}
	setA, setB := pick(perm[:k]), pick(perm[k:2*k])
	watchedA := setA[:handful]
	multiSubjects := setB[:multi]
	inA, inB := map[string]bool{}, map[string]bool{}
	for _, s := range setA {
		inA[s] = true
	}
	for _, s := range setB {
		inB[s] = true
	}

	exp := time.Now().Add(time.Hour).Unix()
	token := func(subject string) string {
		return apptokentest.HS256(t, secret, jwt.MapClaims{"sub": subject, "exp": exp}, nil)
	}
	clients := &scaleClients{host: host}
	t.Cleanup(clients.closeAll)

	base := afterGC(t, p.url, pid, 0, sampleRunner(t, p.url, pid).gcs)
	subscribes0 := subscribeCalls(t, rdb)

	// Phase A: a handful of streams, K changes.
	openStart := time.Now()
	clients.open(t, watchedA[:1], token, 1)
	firstOpen := time.Since(openStart)
	clients.open(t, watchedA[1:], token, openWorkers)
	handfulOpen := time.Since(openStart)
	subscribesA := subscribeCalls(t, rdb)
	startA := time.Now()
	runsA := submitAll(t, p.url, operator, scope, shuffled(rng, setA), submitRate)
	waitDone(t, p.url, operator, scope, k)

	// Phase B: the other streams, up to the cap.
	var rest []string
	for _, s := range subjects {
		if !slices.Contains(watchedA, s) {
			rest = append(rest, s)
		}
	}
	for range multiEach - 1 {
		rest = append(rest, multiSubjects...)
	}
	cpuOpen0 := runnerCPU(t, pid)
	openRest := time.Now()
	clients.open(t, rest, token, openWorkers)
	openDur := time.Since(openRest)
	cpuOpen := runnerCPU(t, pid) - cpuOpen0
	if got := clients.count(); got != n {
		t.Fatalf("%d streams open, want %d", got, n)
	}
	subscribesOpen := subscribeCalls(t, rdb)

	// The cap: one stream more is refused, before anything else.
	req, _ := http.NewRequest(http.MethodGet, p.url+"/v1/subjects/"+setB[0]+"/events", nil)
	req.Header.Set("Authorization", "Bearer "+token(setB[0]))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || !bytes.Contains(body, []byte("too_many_clients")) ||
		resp.Header.Get("Retry-After") == "" {
		t.Fatalf("stream %d of a cap of %d: %s %s; want 503 too_many_clients with Retry-After", n+1, n, resp.Status, body)
	}

	// Current state on connect: A's subjects that had no stream get their
	// finished run as soon as their stream opens; nobody else gets anything.
	eventually(t, 30*time.Second, "current state of phase A's subjects on connect", func() error {
		for _, c := range clients.all() {
			if inA[c.subject] && len(c.snapshot()) == 0 {
				return fmt.Errorf("%s: no view yet", c.subject)
			}
		}
		return nil
	})
	open := settledRunner(t, p.url, pid, n)
	pubsubConns := pubsubClients(t, rdb)

	// Phase B: K changes, every stream open.
	startB := time.Now()
	cpuB0 := runnerCPU(t, pid)
	runsB := submitAll(t, p.url, operator, scope, shuffled(rng, setB), submitRate)
	// Each stream of a changed subject receives its run's final state.
	final := func(c *scaleClient) (string, bool) {
		want := runsA[c.subject].runID
		if inB[c.subject] {
			want = runsB[c.subject].runID
		}
		// Another subject's views are left to the isolation check below.
		vs := slices.DeleteFunc(c.snapshot(), func(v gotView) bool { return v.subject != c.subject })
		return want, len(vs) > 0 && vs[len(vs)-1].runID == want && vs[len(vs)-1].status == jobs.StatusDone
	}
	eventually(t, 60*time.Second, "every changed subject's streams receive its final state", func() error {
		for _, c := range clients.all() {
			if v, ok := clients.foreign(c); ok {
				t.Fatalf("stream of %s received a view of %s (run %s)", c.subject, v.subject, v.runID)
			}
			if !inA[c.subject] && !inB[c.subject] {
				continue
			}
			if want, ok := final(c); !ok {
				return fmt.Errorf("stream of %s: last views %v, want run %s done", c.subject, tail(c.snapshot(), 3), want)
			}
		}
		return nil
	})
	cpuB := runnerCPU(t, pid) - cpuB0
	durB := time.Since(startB)

	var idleCPU time.Duration
	if idle > 0 {
		c0 := runnerCPU(t, pid)
		time.Sleep(idle) // a measurement window, not a wait for state
		idleCPU = runnerCPU(t, pid) - c0
	}
	after := afterGC(t, p.url, pid, n, open.gcs)

	// Isolation and delivery, stream by stream.
	perSubject := map[string]int{}
	for _, c := range clients.all() {
		perSubject[c.subject]++
		if err := c.failure(); err != nil {
			t.Errorf("stream of %s ended: %v", c.subject, err)
		}
		vs := c.snapshot()
		for _, v := range vs {
			if v.subject != c.subject {
				t.Errorf("stream of %s received a view of %s (run %s)", c.subject, v.subject, v.runID)
			}
		}
		switch {
		case inA[c.subject] || inB[c.subject]:
			if want, ok := final(c); !ok {
				t.Errorf("stream of %s: last views %v, want run %s done", c.subject, tail(vs, 3), want)
			}
			if inA[c.subject] && !slices.Contains(watchedA, c.subject) && (len(vs) != 1 || vs[0].at.Before(openRest)) {
				t.Errorf("stream of %s (changed before it opened): %d views %v, want its current state once", c.subject, len(vs), tail(vs, 3))
			}
		case len(vs) > 0:
			t.Errorf("stream of %s, a subject that never changed, received %d views: %v", c.subject, len(vs), tail(vs, 3))
		}
	}
	for _, s := range multiSubjects {
		if perSubject[s] != multiEach {
			t.Errorf("%s has %d streams, want %d", s, perSubject[s], multiEach)
		}
	}
	if pubsubConns != 1 {
		t.Errorf("%d Redis connections with subscriptions while %d streams were open, want 1", pubsubConns, n)
	}
	// The registry's pub/sub hub re-SUBSCRIBEs one channel every few
	// seconds as a liveness probe; a subscription per stream would be one
	// or more per stream.
	if d := subscribesOpen - subscribesA; d > 2+int64(len(rest)/100) {
		t.Errorf("opening %d more streams sent %d SUBSCRIBE commands to Redis, want no more than the hub's probes (the subscription is shared)", len(rest), d)
	}
	if got := stageCalls.Load(); got != int64(2*k) {
		t.Errorf("the stage ran %d times, want %d", got, 2*k)
	}

	// The figures.
	latA := clients.latencies(watchedA, startA)
	latB := clients.latencies(setB, startB)
	subA := submitLatencies(clients, runsA, watchedA)
	subB := submitLatencies(clients, runsB, setB)
	per := func(a, b float64) float64 { return (a - b) / float64(n) }
	t.Logf(`subject streams at scale (%s=%d, GOMAXPROCS of the runner: %d CPUs):
  streams            %d (%d subjects; %d subjects × %d streams), cap http.maxSubjectStreams=%d; stream %d refused 503
  opening            %d streams in %v (%.0f/s), runner CPU %v (%.0f µs a stream); first stream %v (it subscribes), first %d streams %v
  redis              %d connection with subscriptions; SUBSCRIBE calls: %d to open the first stream, %d for the other %d
  runner before (GC) RSS %.1f MiB, heap in use %.1f MiB, stacks %.1f MiB, %d goroutines
  runner open        RSS %.1f MiB, heap in use %.1f MiB, stacks %.1f MiB, %d goroutines (settled)
  runner after GC    RSS %.1f MiB, heap in use %.1f MiB, stacks %.1f MiB, %d goroutines (GC cycles %d → %d)
  per stream         heap %.1f KiB (after GC; %.1f KiB settled), stacks %.1f KiB, %.2f goroutines;
                     RSS %.1f KiB once open, %.1f KiB after the heap grew to its GC goal
  delivery, %3d open %s (%d views of %d watched subjects; %d runs at %d/s)
  delivery, all open %s (%d views of %d subjects; %d runs at %d/s)
  submit → queued view on the stream: %d open %s; all open %s
  phase B            runner CPU %v for %d runs (%.0f µs a run, %.0f µs per view delivered), %v
  idle               %s
  (view latency = receipt − the view's updatedAt, which is in whole ms: each figure is high by up to 1 ms)`,
		subjectStreamsEnv, n, runtime.NumCPU(),
		n, subjectCount, multi, multiEach, n, n+1,
		len(rest), openDur.Round(time.Millisecond), float64(len(rest))/openDur.Seconds(), cpuOpen, float64(cpuOpen.Microseconds())/float64(len(rest)),
		firstOpen.Round(time.Millisecond), handful, handfulOpen.Round(time.Millisecond),
		pubsubConns, subscribesA-subscribes0, subscribesOpen-subscribesA, len(rest),
		mib(base.rss), mib(base.heapInuse), mib(base.stackInuse), base.goroutines,
		mib(open.rss), mib(open.heapInuse), mib(open.stackInuse), open.goroutines,
		mib(after.rss), mib(after.heapInuse), mib(after.stackInuse), after.goroutines, open.gcs, after.gcs,
		per(after.heapInuse, base.heapInuse)/1024, per(open.heapInuse, base.heapInuse)/1024,
		per(after.stackInuse, base.stackInuse)/1024, per(float64(open.goroutines), float64(base.goroutines)),
		per(open.rss, base.rss)/1024, per(after.rss, base.rss)/1024,
		handful, latA, latA.n, handful, k, submitRate,
		latB, latB.n, k, k, submitRate,
		handful, subA, subB,
		cpuB, k, float64(cpuB.Microseconds())/float64(k), float64(cpuB.Microseconds())/float64(max(latB.n, 1)), durB.Round(time.Millisecond),
		idleLine(idle, idleCPU, n))
}
