package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// sseStream reads Server-Sent Events messages from a response body.
type sseStream struct {
	t    *testing.T
	res  *http.Response
	msgs chan sseMsg
}

type sseMsg struct {
	event, data string
	comments    []string
}

func openSSE(t *testing.T, client *http.Client, url string) *sseStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { res.Body.Close() })
	if res.StatusCode != 200 {
		b, _ := io.ReadAll(res.Body)
		t.Fatalf("events: %d %s", res.StatusCode, b)
	}
	s := &sseStream{t: t, res: res, msgs: make(chan sseMsg, 100)}
	go func() {
		defer close(s.msgs)
		sc := bufio.NewScanner(res.Body)
		var m sseMsg
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				s.msgs <- m
				m = sseMsg{}
			case strings.HasPrefix(line, ":"):
				m.comments = append(m.comments, strings.TrimSpace(line[1:]))
			case strings.HasPrefix(line, "event: "):
				m.event = line[len("event: "):]
			case strings.HasPrefix(line, "data: "):
				m.data += line[len("data: "):]
			}
		}
	}()
	return s
}

// next returns the next message matching ok, failing after d.
func (s *sseStream) next(d time.Duration, what string, ok func(sseMsg) bool) sseMsg {
	s.t.Helper()
	timeout := time.After(d)
	for {
		select {
		case m, open := <-s.msgs:
			if !open {
				s.t.Fatalf("stream ended waiting for %s", what)
			}
			if ok(m) {
				return m
			}
		case <-timeout:
			s.t.Fatalf("timed out after %s waiting for %s", d, what)
		}
	}
}

// taskEvent matches `event: task` messages of key, decoding the view.
func taskEvent(t *testing.T, key string, cond func(map[string]any) bool) func(sseMsg) bool {
	return func(m sseMsg) bool {
		if m.event != "task" {
			return false
		}
		var v map[string]any
		dec := json.NewDecoder(strings.NewReader(m.data))
		dec.UseNumber()
		if err := dec.Decode(&v); err != nil {
			t.Errorf("bad task data %q: %v", m.data, err)
			return false
		}
		return v["key"] == key && (cond == nil || cond(v))
	}
}

func TestEvents(t *testing.T) {
	e := newEnv(t, envOpts{})
	s := openSSE(t, e.srv.Client(), e.srv.URL+"/v1/events")
	if ct := s.res.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	if cc := s.res.Header.Get("Cache-Control"); cc != "no-cache" {
		t.Fatalf("cache control %q", cc)
	}
	s.next(2*time.Second, "connected comment", func(m sseMsg) bool { return len(m.comments) > 0 })

	mustStatus(t, e.do("POST", "/v1/tasks/u1/course_sync/runs", ""), 200, "")
	m := s.next(5*time.Second, "task event", taskEvent(t, "u1|course_sync", nil))
	var v any
	dec := json.NewDecoder(strings.NewReader(m.data))
	dec.UseNumber()
	if err := dec.Decode(&v); err != nil {
		t.Fatal(err)
	}
	if tv := checkTaskView(t, v); tv["status"] != "queued" {
		t.Fatalf("first event %v", tv)
	}
	// Keep-alive comments flow while nothing changes.
	s.next(2*time.Second, "keep-alive", func(m sseMsg) bool {
		for _, c := range m.comments {
			if c == "ping" {
				return true
			}
		}
		return false
	})
}

// TestEventsFollowARun: the feed shows the run's stages and its end.
func TestEventsFollowARun(t *testing.T) {
	e := newEnv(t, envOpts{})
	e.startRunner()
	s := openSSE(t, e.srv.Client(), e.srv.URL+"/v1/events")
	s.next(2*time.Second, "connected", func(m sseMsg) bool { return len(m.comments) > 0 })
	e.do("POST", "/v1/tasks/u5/course_sync/runs", "")
	s.next(5*time.Second, "running in pulling", taskEvent(t, "u5|course_sync", func(v map[string]any) bool {
		return v["status"] == "running" && v["stage"] == "pulling"
	}))
	e.releaseStages()
	s.next(5*time.Second, "done", taskEvent(t, "u5|course_sync", func(v map[string]any) bool {
		return v["status"] == "done"
	}))
}

// TestEventsEndWhenClientGoes: the handler returns (and logs its status)
// once the client disconnects.
func TestEventsEndWhenClientGoes(t *testing.T) {
	e := newEnv(t, envOpts{})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", e.srv.URL+"/v1/events", nil)
	res, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	res.Body.Close()
	waitFor(t, 5*time.Second, "handler end", func() bool {
		_, ok := e.logs.find(-4, "http", map[string]string{"path": "/v1/events"})
		return ok
	})
}

// TestEventsSurviveReadTimeoutAndEndOnShutdown runs the real server from
// NewServer: the SSE stream must outlive ReadTimeout (net/http cancels the
// request context at the read deadline unless the handler clears it), and
// Shutdown must end it rather than wait for the client.
func TestEventsSurviveReadTimeoutAndEndOnShutdown(t *testing.T) {
	e := newEnv(t, envOpts{})
	srv := NewServer("", e.h)
	srv.ReadTimeout = 200 * time.Millisecond
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	base := "http://" + ln.Addr().String()
	client := &http.Client{}
	t.Cleanup(client.CloseIdleConnections)

	s := openSSE(t, client, base+"/v1/events")
	s.next(2*time.Second, "connected", func(m sseMsg) bool { return len(m.comments) > 0 })
	time.Sleep(3 * srv.ReadTimeout)
	res, err := client.Post(base+"/v1/tasks/u1/backup/runs", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	s.next(5*time.Second, "event after ReadTimeout", taskEvent(t, "u1|backup", nil))

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown with an open SSE stream: %v after %s", err, time.Since(start))
	}
	if err := <-served; err != http.ErrServerClosed {
		t.Fatal(err)
	}
	for range s.msgs { // the stream ends
	}
}

// TestEventsAfterRequestOnSameConnection: a non-SSE request sets a short
// write deadline on the connection; an SSE stream that follows on the same
// keep-alive connection must not inherit it.
func TestEventsAfterRequestOnSameConnection(t *testing.T) {
	e := newEnv(t, envOpts{noServer: true})
	h := newAPI(e.reg, Options{Logger: slog.New(slog.DiscardHandler)},
		settings{keepAlive: 20 * time.Millisecond, requestTimeout: 50 * time.Millisecond, writeGrace: 50 * time.Millisecond})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	var conns atomic.Int32
	client := &http.Client{Transport: &http.Transport{
		MaxConnsPerHost: 1,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			conns.Add(1)
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
	}}
	t.Cleanup(client.CloseIdleConnections)
	res, err := client.Get(srv.URL + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()

	s := openSSE(t, client, srv.URL+"/v1/events")
	time.Sleep(300 * time.Millisecond) // well past the healthz write deadline
	var pings int
	for len(s.msgs) > 0 {
		if m := <-s.msgs; len(m.comments) > 0 {
			pings++
		}
	}
	if pings < 5 {
		t.Fatalf("only %d keep-alives in 300ms", pings)
	}
	s.next(time.Second, "keep-alive after the old deadline", func(m sseMsg) bool { return len(m.comments) > 0 })
	if n := conns.Load(); n != 1 {
		t.Fatalf("test needs one shared connection, used %d", n)
	}
}
