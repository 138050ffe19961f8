package httpapi

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tasklease/tasklease/jobs"
	"github.com/tasklease/tasklease/taskkey"
)

// subjectStreamBuffer is each subject stream's queue of views. One that
// overflows is not dropped: it is told to resend its subject's current
// state, which a client needs anyway (views are states, not deltas). The
// queue holds pointers: a TaskView is ~300 bytes, and 16 of them made
// each of up to 10,000 mostly idle streams hold 5.5 KiB of empty buffer.
const subjectStreamBuffer = 16

// subjectHub delivers task views to subject streams. It holds one
// Registry.Subscribe (so one pub/sub connection, shared with the operator
// feed by the registry's hub) while at least one subject stream is open,
// decodes each view once, and hands it to the streams of the view's subject
// only: a map lookup, not a scan of every client.
type subjectHub struct {
	reg *jobs.Registry
	log *slog.Logger

	mu      sync.Mutex
	streams map[string]map[*subjectStream]struct{} // by subject
	n       int
	cancel  context.CancelFunc // of the current subscription, while n > 0
	// gen numbers subscriptions, so one that ends late does not touch its
	// successor's state.
	gen uint64
}

// subjectStream is one client's share of the hub.
type subjectStream struct {
	subject string
	// views are shared by every stream of the subject: read-only.
	views chan *jobs.TaskView
	// resync is signalled when views overflowed: the stream must resend
	// its subject's current state.
	resync chan struct{}
	// lost is closed when the hub's subscription ends under the stream.
	lost     chan struct{}
	lostOnce sync.Once
}

func newSubjectHub(reg *jobs.Registry, log *slog.Logger) *subjectHub {
	return &subjectHub{reg: reg, log: log, streams: map[string]map[*subjectStream]struct{}{}}
}

// join registers a stream for subject. When it returns, every view
// published afterwards reaches the stream (the subscription is confirmed).
func (h *subjectHub) join(ctx context.Context, subject string) (*subjectStream, error) {
	s := &subjectStream{subject: subject, views: make(chan *jobs.TaskView, subjectStreamBuffer),
		resync: make(chan struct{}, 1), lost: make(chan struct{})}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n == 0 {
		// The subscription must not end with this request: it serves every
		// subject stream until the last one leaves.
		subCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		views, err := h.reg.Subscribe(subCtx)
		if err != nil {
			cancel()
			return nil, err
		}
		h.cancel = cancel
		h.gen++
		go h.dispatch(views, h.gen)
	}
	h.n++
	set := h.streams[subject]
	if set == nil {
		set = map[*subjectStream]struct{}{}
		h.streams[subject] = set
	}
	set[s] = struct{}{}
	return s, nil
}

// leave unregisters s; the last stream out ends the subscription.
func (h *subjectHub) leave(s *subjectStream) {
	h.mu.Lock()
	defer h.mu.Unlock()
	set := h.streams[s.subject]
	if _, ok := set[s]; !ok {
		return
	}
	delete(set, s)
	if len(set) == 0 {
		delete(h.streams, s.subject)
	}
	h.n--
	if h.n == 0 && h.cancel != nil {
		h.cancel()
		h.cancel = nil
	}
}

// dispatch hands each view to its subject's streams, never blocking on one.
func (h *subjectHub) dispatch(views <-chan jobs.TaskView, gen uint64) {
	for v := range views {
		h.mu.Lock()
		if set := h.streams[v.Subject]; h.gen == gen && len(set) > 0 {
			shared := new(jobs.TaskView) // one copy for the subject's streams
			*shared = v
			for s := range set {
				select {
				case s.views <- shared:
				default:
					select {
					case s.resync <- struct{}{}:
					default:
					}
				}
			}
		}
		h.mu.Unlock()
	}
	// The subscription ended: cancelled by the last leave, or lost while
	// streams were open (then they end, and their clients reconnect).
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.gen != gen || h.n == 0 {
		return
	}
	for _, set := range h.streams {
		for s := range set {
			s.lostOnce.Do(func() { close(s.lost) })
		}
	}
}

// subjectEvents streams one subject's task views as Server-Sent Events, in
// the shape of GET /v1/events: first the subject's current state (one
// "event: task" per task that exists, within the token's scopes), then
// every change. A subject token's stream ends when the token expires (a
// ": token expired" comment, then the end), so a client reconnects with a
// fresh token; the current state it gets then means it misses nothing.
func (a *api) subjectEvents(w http.ResponseWriter, r *http.Request) {
	subject := r.PathValue("subject")
	if err := taskkey.ValidateSubject(subject); err != nil {
		a.fail(w, r, err)
		return
	}
	p := principalOf(r.Context())
	allowScope := func(string) bool { return true }
	var expires <-chan time.Time
	if p.role == roleSubject {
		// Verification allows exp a few seconds of clock skew; a stream
		// does not: it would end at once, and a client reconnecting with
		// the same token would loop. The 401 tells it to get a new one.
		if !time.Now().Before(p.grant.Expires) {
			unauthorized(w, "subject token expired: a stream needs one that has not")
			return
		}
		allowScope = p.grant.AllowsScope
		t := time.NewTimer(time.Until(p.grant.Expires))
		defer t.Stop()
		expires = t.C
	}
	if !acquire(&a.openSubject, a.maxSubject) {
		tooManyStreams(w, "subject streams", a.maxSubject, "http.maxSubjectStreams")
		return
	}
	defer a.openSubject.Add(-1)

	ctx := r.Context()
	s, err := a.subjectHub.join(ctx, subject)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	defer a.subjectHub.leave(s)
	// Subscribed before reading the state: a change between the two is
	// sent twice at worst, never missed.
	current, err := a.subjectState(ctx, subject, allowScope)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	sse, ok := startSSE(w)
	if !ok {
		return
	}
	for _, v := range current {
		if !a.sendView(ctx, sse, v) {
			return
		}
	}

	tick := time.NewTicker(a.set.keepAlive)
	defer tick.Stop()
	shutdown := shutdownChan(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-shutdown:
			return
		case <-s.lost:
			return
		case <-expires:
			_ = sse.send([]byte(": token expired\n\n"))
			return
		case <-tick.C:
			if !sse.send([]byte(": ping\n\n")) {
				return
			}
		case <-s.resync:
			current, err := a.subjectState(ctx, subject, allowScope)
			if err != nil {
				return // Redis is gone; the client reconnects
			}
			for _, v := range current {
				if !a.sendView(ctx, sse, v) {
					return
				}
			}
		case v := <-s.views:
			if !allowScope(v.Scope) {
				continue
			}
			if !a.sendView(ctx, sse, *v) {
				return
			}
		}
	}
}

// subjectState reads the current view of each of the subject's tasks that
// exists, one Get per job: a subject has a task per scope at most.
func (a *api) subjectState(ctx context.Context, subject string, allowScope func(string) bool) ([]jobs.TaskView, error) {
	var out []jobs.TaskView
	for _, sc := range a.reg.Scopes() {
		if !allowScope(sc) {
			continue
		}
		v, err := a.reg.Get(ctx, subject, sc)
		if errors.Is(err, jobs.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}

// acquire takes one of max stream slots counted by n, if one is free.
// Compare-and-swap, so that racing requests never see a transient count
// above the limit and refuse a client there was room for.
func acquire(n *atomic.Int64, max int64) bool {
	for {
		c := n.Load()
		if c >= max {
			return false
		}
		if n.CompareAndSwap(c, c+1) {
			return true
		}
	}
}
