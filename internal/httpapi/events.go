package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/tasklease/tasklease/jobs"
)

// events streams every task state change as Server-Sent Events:
//
//	event: task
//	data: <TaskView JSON>
//
// with a ": ping" comment every keep-alive interval. It ends when the client
// goes, or when the server built by NewServer shuts down. At most maxEvents
// streams are open at once: one more is answered 503 too_many_clients with
// Retry-After, before it subscribes to anything. Views come from
// Redis pub/sub (Registry.Subscribe): a client that falls behind loses
// messages rather than slowing Redis, so a reconnecting client should
// re-list tasks.
func (a *api) events(w http.ResponseWriter, r *http.Request) {
	if !acquire(&a.openEvents, a.maxEvents) {
		tooManyStreams(w, "event streams", a.maxEvents, "http.maxEventClients")
		return
	}
	defer a.openEvents.Add(-1)

	ctx, cancel := context.WithCancel(r.Context())
	defer cancel() // ends the subscription
	views, err := a.reg.Subscribe(ctx)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	sse, ok := startSSE(w)
	if !ok {
		return
	}
	send := sse.send

	tick := time.NewTicker(a.set.keepAlive)
	defer tick.Stop()
	shutdown := shutdownChan(r.Context())
	for {
		select {
		case <-ctx.Done():
			return
		case <-shutdown:
			return
		case <-tick.C:
			if !send([]byte(": ping\n\n")) {
				return
			}
		case v, ok := <-views:
			if !ok {
				return
			}
			if !a.sendView(ctx, sse, v) {
				return
			}
		}
	}
}

// tooManyStreams answers a stream request refused because max streams of
// its kind (what; the setting that bounds them) are open: 503 with
// Retry-After.
func tooManyStreams(w http.ResponseWriter, what string, max int64, setting string) {
	w.Header().Set("Retry-After", eventsRetryAfter)
	writeError(w, http.StatusServiceUnavailable, "too_many_clients", fmt.Sprintf(
		"too many %s: this runner serves at most %d at once (%s); retry in %s seconds", what, max, setting, eventsRetryAfter))
}

// sseConn writes one Server-Sent Events response.
type sseConn struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

// startSSE sends the headers of an event stream and its first comment.
// The stream must outlive ReadTimeout and the write deadline other routes
// use. net/http already lifts both for a body-less request (after the
// headers, and after each response); clearing them here keeps that true
// whatever the request or the Go version. Errors: not a real connection.
func startSSE(w http.ResponseWriter) (*sseConn, bool) {
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Time{})
	_ = rc.SetWriteDeadline(time.Time{})
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // nginx would buffer the stream otherwise
	w.WriteHeader(http.StatusOK)
	c := &sseConn{w: w, rc: rc}
	// retry: the client's reconnect delay. The comment makes the headers go
	// out now, so EventSource reports "open" before the first change.
	return c, c.send([]byte("retry: 2000\n: connected\n\n"))
}

// send writes one message under its own write deadline, so a client that
// stops reading is dropped instead of pinning this goroutine.
func (c *sseConn) send(msg []byte) bool {
	_ = c.rc.SetWriteDeadline(time.Now().Add(sseWriteTimeout))
	if _, err := c.w.Write(msg); err != nil {
		return false
	}
	return c.rc.Flush() == nil
}

// sendView sends one "event: task" message; false when the client is gone.
func (a *api) sendView(ctx context.Context, c *sseConn, v jobs.TaskView) bool {
	b, err := json.Marshal(v)
	if err != nil {
		a.log.LogAttrs(ctx, slog.LevelError, "http: encode task view", slog.Any("error", err))
		return true
	}
	msg := make([]byte, 0, len(b)+24)
	msg = append(msg, "event: task\ndata: "...)
	msg = append(msg, b...)
	msg = append(msg, "\n\n"...)
	return c.send(msg)
}
