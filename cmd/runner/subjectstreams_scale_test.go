package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/redis/go-redis/v9"

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

// scaleClients are the test's stream clients.
type scaleClients struct {
	host string
	mu   sync.Mutex
	cs   []*scaleClient
}

// scaleClient is one subject stream read over a raw connection: one
// goroutine and two small buffers, so that the test process stays cheap.
type scaleClient struct {
	subject   string
	conn      net.Conn
	connected chan struct{} // closed at ": connected"
	done      chan struct{} // closed when the reader returns

	mu    sync.Mutex
	views []gotView
	err   error
}

// gotView is what a stream received of one view.
type gotView struct {
	at      time.Time // receipt
	updated time.Time
	subject string
	runID   string
	status  jobs.Status
}

func (v gotView) String() string { return v.subject + "/" + v.runID + "/" + string(v.status) }

func (c *scaleClient) snapshot() []gotView {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.views)
}

// failure is why the stream ended before the test closed it, or nil.
func (c *scaleClient) failure() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (cs *scaleClients) all() []*scaleClient {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return slices.Clone(cs.cs)
}

// foreign returns a view of another subject that c received, if any.
func (cs *scaleClients) foreign(c *scaleClient) (gotView, bool) {
	for _, v := range c.snapshot() {
		if v.subject != c.subject {
			return v, true
		}
	}
	return gotView{}, false
}

func (cs *scaleClients) count() int {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return len(cs.cs)
}

// closeAll closes every connection and waits for the readers.
func (cs *scaleClients) closeAll() {
	for _, c := range cs.all() {
		_ = c.conn.Close()
	}
	for _, c := range cs.all() {
		<-c.done
	}
}

// open opens a stream for each of subjects (a subject listed twice gets
// two), workers at a time, each until it received ": connected".
func (cs *scaleClients) open(t *testing.T, subjects []string, token func(string) string, workers int) {
	t.Helper()
	work := make(chan string)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for s := range work {
				if err := cs.openOne(s, token(s)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	var err error
feed:
	for _, s := range subjects {
		select {
		case work <- s:
		case err = <-errs:
			break feed
		}
	}
	close(work)
	wg.Wait()
	if err == nil {
		select {
		case err = <-errs:
		default:
		}
	}
	if err != nil {
		t.Fatalf("opening streams (%d open): %v", cs.count(), err)
	}
}

func (cs *scaleClients) openOne(subject, token string) error {
	conn, err := net.DialTimeout("tcp", cs.host, 10*time.Second)
	if err != nil {
		return err
	}
	c := &scaleClient{subject: subject, conn: conn, connected: make(chan struct{}), done: make(chan struct{})}
	if _, err := fmt.Fprintf(conn, "GET /v1/subjects/%s/events HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nAccept: text/event-stream\r\n\r\n",
		subject, cs.host, token); err != nil {
		conn.Close()
		return err
	}
	cs.mu.Lock()
	cs.cs = append(cs.cs, c)
	cs.mu.Unlock()
	go c.read()
	select {
	case <-c.connected:
		return nil
	case <-c.done:
		return fmt.Errorf("stream of %s: %v", subject, c.failure())
	case <-time.After(30 * time.Second):
		return fmt.Errorf("stream of %s: no \": connected\" within 30s", subject)
	}
}

// read parses the response: the status line and headers, then the chunked
// body line by line.
func (c *scaleClient) read() {
	defer close(c.done)
	fail := func(err error) {
		c.mu.Lock()
		if c.err == nil {
			c.err = err
		}
		c.mu.Unlock()
	}
	br := bufio.NewReaderSize(c.conn, 1024)
	status, err := br.ReadString('\n')
	if err != nil {
		fail(fmt.Errorf("status line: %w", err))
		return
	}
	chunked := false
	for {
		h, err := br.ReadString('\n')
		if err != nil {
			fail(fmt.Errorf("headers: %w", err))
			return
		}
		if h == "\r\n" {
			break
		}
		if strings.EqualFold(strings.TrimSpace(h), "Transfer-Encoding: chunked") {
			chunked = true
		}
	}
	if !strings.HasPrefix(status, "HTTP/1.1 200 ") || !chunked {
		rest, _ := io.ReadAll(io.LimitReader(br, 512))
		fail(fmt.Errorf("%s (chunked %v) %s", strings.TrimSpace(status), chunked, rest))
		return
	}
	lr := bufio.NewReaderSize(httputil.NewChunkedReader(br), 2048)
	var line []byte
	for {
		part, err := lr.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			line = append(line, part...)
			continue
		}
		if err != nil {
			if !isClosedErr(err) {
				fail(err)
			}
			return
		}
		if line != nil {
			part = append(line, part...)
			line = nil
		}
		part = bytes.TrimRight(part, "\r\n")
		switch {
		case string(part) == ": connected":
			close(c.connected)
		case bytes.HasPrefix(part, []byte("data: ")):
			at := time.Now()
			var v struct {
				Subject   string      `json:"subject"`
				RunID     string      `json:"runId"`
				Status    jobs.Status `json:"status"`
				UpdatedAt *time.Time  `json:"updatedAt"`
			}
			if err := json.Unmarshal(part[len("data: "):], &v); err != nil {
				fail(fmt.Errorf("view %q: %w", part, err))
				return
			}
			g := gotView{at: at, subject: v.Subject, runID: v.RunID, status: v.Status}
			if v.UpdatedAt != nil {
				g.updated = *v.UpdatedAt
			}
			c.mu.Lock()
			c.views = append(c.views, g)
			c.mu.Unlock()
		}
	}
}

// isClosedErr: the test closed the connection.
func isClosedErr(err error) bool {
	return errors.Is(err, net.ErrClosed)
}

// latencySummary is p50/p99/max of a set of durations.
type latencySummary struct {
	n             int
	p50, p99, max time.Duration
}

func (l latencySummary) String() string {
	if l.n == 0 {
		return "no samples"
	}
	return fmt.Sprintf("p50 %v, p99 %v, max %v", l.p50.Round(10*time.Microsecond), l.p99.Round(10*time.Microsecond), l.max.Round(10*time.Microsecond))
}

func summarize(ds []time.Duration) latencySummary {
	if len(ds) == 0 {
		return latencySummary{}
	}
	slices.Sort(ds)
	at := func(q int) time.Duration { return ds[min(len(ds)-1, len(ds)*q/100)] }
	return latencySummary{n: len(ds), p50: at(50), p99: at(99), max: ds[len(ds)-1]}
}

// latencies: receipt − updatedAt of every view that subjects' streams
// received of changes made since since.
func (cs *scaleClients) latencies(subjects []string, since time.Time) latencySummary {
	want := map[string]bool{}
	for _, s := range subjects {
		want[s] = true
	}
	var ds []time.Duration
	floor := since.Truncate(time.Millisecond)
	for _, c := range cs.all() {
		if !want[c.subject] {
			continue
		}
		for _, v := range c.snapshot() {
			if !v.updated.Before(floor) {
				ds = append(ds, v.at.Sub(v.updated))
			}
		}
	}
	return summarize(ds)
}

// submitted is one run submitted through the operator API.
type submitted struct {
	runID string
	sent  time.Time
}

// submitLatencies: the time from sending a submit to its stream's first
// view of the run, for subjects' streams.
func submitLatencies(cs *scaleClients, runs map[string]submitted, subjects []string) latencySummary {
	want := map[string]bool{}
	for _, s := range subjects {
		want[s] = true
	}
	var ds []time.Duration
	for _, c := range cs.all() {
		r, ok := runs[c.subject]
		if !want[c.subject] || !ok {
			continue
		}
		for _, v := range c.snapshot() {
			if v.runID == r.runID {
				ds = append(ds, v.at.Sub(r.sent))
				break
			}
		}
	}
	return summarize(ds)
}

// submitAll submits a run for each subject at rate a second (paced by
// send time, a few requests in flight) and returns the runs by subject.
func submitAll(t *testing.T, base, operator, scope string, subjects []string, rate int) map[string]submitted {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}, Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()
	var mu sync.Mutex
	runs := map[string]submitted{}
	var firstErr error
	work := make(chan string)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for s := range work {
				sent := time.Now()
				req, _ := http.NewRequest(http.MethodPost, base+"/v1/tasks/"+s+"/"+scope+"/runs", strings.NewReader(`{"source":"manual"}`))
				req.Header.Set("Authorization", "Bearer "+operator)
				req.Header.Set("Content-Type", "application/json")
				var res jobs.SubmitResult
				resp, err := client.Do(req)
				if err == nil {
					if resp.StatusCode != http.StatusOK {
						b, _ := io.ReadAll(resp.Body)
						err = fmt.Errorf("submit %s: %s %s", s, resp.Status, b)
					} else {
						err = json.NewDecoder(resp.Body).Decode(&res)
					}
					resp.Body.Close()
				}
				mu.Lock()
				if err != nil && firstErr == nil {
					firstErr = err
				}
				if err == nil {
					runs[s] = submitted{runID: res.Task.RunID, sent: sent}
				}
				mu.Unlock()
			}
		})
	}
	start := time.Now()
	interval := time.Second / time.Duration(rate)
	for i, s := range subjects {
		if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
			time.Sleep(d) // pacing the load, not waiting for state
		}
		work <- s
	}
	close(work)
	wg.Wait()
	if firstErr != nil {
		t.Fatal(firstErr)
	}
	for s, r := range runs {
		if r.runID == "" {
			t.Fatalf("submit %s: no run id", s)
		}
	}
	return runs
}

// waitDone waits until want runs of scope are done.
func waitDone(t *testing.T, base, operator, scope string, want int) {
	t.Helper()
	eventually(t, 60*time.Second, fmt.Sprintf("%d runs done", want), func() error {
		var page struct {
			Total int `json:"total"`
		}
		code, err := getJSON(base+"/v1/tasks?scope="+scope+"&status=done&limit=1", operator, &page)
		if err != nil || code != http.StatusOK {
			return fmt.Errorf("list: %d %v", code, err)
		}
		if page.Total != want {
			return fmt.Errorf("%d done", page.Total)
		}
		return nil
	})
}

func shuffled(rng *rand.Rand, s []string) []string {
	out := slices.Clone(s)
	rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

func tail(vs []gotView, n int) []gotView { return vs[max(0, len(vs)-n):] }

func mib(b float64) float64 { return b / (1 << 20) }

func idleLine(window, cpu time.Duration, n int) string {
	if window == 0 {
		return "not measured (" + subjectStreamsIdleEnv + ")"
	}
	return fmt.Sprintf("runner CPU %v in %v with %d streams open and nothing changing (%.2f%% of a core)",
		cpu, window, n, 100*cpu.Seconds()/window.Seconds())
}

// runnerSample is the runner's memory and goroutines at one moment.
type runnerSample struct {
	rss, heapInuse, stackInuse float64
	goroutines                 int
	gcs                        int64
}

// sampleRunner reads VmRSS from /proc and the Go figures from /metrics.
// It asks for gzip, as Prometheus does, which makes each scrape allocate a
// compressor (about a MiB) in the runner: afterGC relies on that.
func sampleRunner(t *testing.T, base string, pid int) runnerSample {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, base+"/metrics", nil)
	req.Header.Set("Accept-Encoding", "gzip")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body io.Reader = resp.Body
	if resp.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		body = zr
	}
	m := map[string]float64{}
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if !ok || strings.HasPrefix(name, "#") {
			continue
		}
		if f, err := strconv.ParseFloat(strings.TrimSpace(val), 64); err == nil {
			m[name] = f
		}
	}
	for _, k := range []string{"go_memstats_heap_inuse_bytes", "go_memstats_stack_inuse_bytes", "go_goroutines", "go_gc_duration_seconds_count"} {
		if _, ok := m[k]; !ok {
			t.Fatalf("/metrics has no %s", k)
		}
	}
	return runnerSample{rss: procRSS(t, pid), heapInuse: m["go_memstats_heap_inuse_bytes"], stackInuse: m["go_memstats_stack_inuse_bytes"],
		goroutines: int(m["go_goroutines"]), gcs: int64(m["go_gc_duration_seconds_count"])}
}

// settledRunner polls until two samples 250 ms apart agree: the same
// goroutine count, at least streams*2 of them above nothing, and heap in
// use within 1 %.
func settledRunner(t *testing.T, base string, pid, streams int) runnerSample {
	t.Helper()
	prev := sampleRunner(t, base, pid)
	deadline := time.Now().Add(60 * time.Second)
	for {
		time.Sleep(250 * time.Millisecond) // sampling interval
		cur := sampleRunner(t, base, pid)
		if cur.goroutines == prev.goroutines && cur.goroutines >= streams &&
			abs(cur.heapInuse-prev.heapInuse) <= 0.01*prev.heapInuse {
			return cur
		}
		if time.Now().After(deadline) {
			t.Logf("runner did not settle within 60s: %+v then %+v", prev, cur)
			return cur
		}
		prev = cur
	}
}

// afterGC returns a settled sample taken after a GC cycle that began
// after gcs cycles had completed, once the sweep that follows it has
// freed the dead objects' spans: the heap in use is then about the live
// heap. Nothing else allocates much in the idle runner, so it scrapes
// /metrics until a cycle comes (each scrape allocates about a MiB).
func afterGC(t *testing.T, base string, pid, streams int, gcs int64) runnerSample {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		s := sampleRunner(t, base, pid)
		if s.gcs > gcs+1 { // cycle gcs+1 may have begun before gcs was read
			return settledRunner(t, base, pid, streams)
		}
		if time.Now().After(deadline) {
			t.Logf("no GC cycle in the runner within 60s: the heap figures \"after GC\" are without one")
			return s
		}
	}
}

func abs(f float64) float64 {
	if f < 0 {
		return -f
	}
	return f
}

// procRSS is the process's resident set, from /proc/<pid>/status.
func procRSS(t *testing.T, pid int) float64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			if err != nil {
				t.Fatalf("VmRSS %q: %v", v, err)
			}
			return kb * 1024
		}
	}
	t.Fatal("no VmRSS in /proc/<pid>/status")
	return 0
}

// runnerCPU is the process's user + system CPU time so far, from
// /proc/<pid>/stat (in USER_HZ ticks, 100 a second on Linux).
func runnerCPU(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := bytes.Cut(b, []byte(") "))
	f := strings.Fields(string(after))
	if !ok || len(f) < 13 {
		t.Fatalf("/proc/%d/stat: %q", pid, b)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("/proc/%d/stat: %q", pid, b)
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// subscribeCalls is how many (S|P)SUBSCRIBE commands Redis has served.
func subscribeCalls(t *testing.T, rdb *redis.Client) int64 {
	t.Helper()
	info, err := rdb.Info(t.Context(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, l := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(l), ":calls=")
		if !ok || !slices.Contains([]string{"cmdstat_subscribe", "cmdstat_ssubscribe", "cmdstat_psubscribe"}, name) {
			continue
		}
		calls, _, _ := strings.Cut(rest, ",")
		c, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			t.Fatalf("commandstats line %q", l)
		}
		n += c
	}
	return n
}

// pubsubClients counts Redis's client connections subscribed to anything.
func pubsubClients(t *testing.T, rdb *redis.Client) int {
	t.Helper()
	list, err := rdb.ClientList(t.Context()).Result()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range strings.Split(strings.TrimSpace(list), "\n") {
		for _, f := range strings.Fields(l) {
			k, v, _ := strings.Cut(f, "=")
			if (k == "sub" || k == "psub" || k == "ssub") && v != "0" {
				n++
				break
			}
		}
	}
	return n
}
