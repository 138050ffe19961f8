package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tasklease/tasklease/jobs"
)

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
