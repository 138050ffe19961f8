package jobs

import (
	"context"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"
)

// hubBuffer is each subscription's message buffer. A reader that falls this
// far behind loses messages instead of stalling everyone else; view
// subscribers re-read with Get and the runner's heartbeat returns the cancel
// flag, so nothing depends on every message arriving.
const hubBuffer = 256

// hub shares one Redis pub/sub connection among every subscriber of a
// Registry — SSE clients, dashboards, the runner's cancel listener — and
// fans messages out in Go, so 200 dashboard tabs cost one Redis connection,
// not 200. The connection is opened with the first subscription and closed
// with the last; Redis channels are subscribed while someone listens.
type hub struct {
	rdb redis.UniversalClient

	mu        sync.Mutex
	ps        *redis.PubSub                         // nil while nobody listens
	subs      map[string]map[*subscription]struct{} // channel → listeners
	confirmed map[string]bool                       // channel subscribed, per Redis
	waiters   map[string][]chan struct{}            // closed when the channel is confirmed
}

// subscription is one listener's view of the hub.
type subscription struct {
	h        *hub
	channels []string
	C        chan *redis.Message
	once     sync.Once
}

func newHub(rdb redis.UniversalClient) *hub {
	return &hub{rdb: rdb, subs: map[string]map[*subscription]struct{}{},
		confirmed: map[string]bool{}, waiters: map[string][]chan struct{}{}}
}

// subscribe registers a listener for channels and returns once Redis has
// confirmed every one of them, so nothing published afterwards is missed.
func (h *hub) subscribe(ctx context.Context, channels []string) (*subscription, error) {
	s := &subscription{h: h, channels: channels, C: make(chan *redis.Message, hubBuffer)}
	h.mu.Lock()
	if h.ps == nil {
		h.ps = h.rdb.Subscribe(context.WithoutCancel(ctx))
		go h.read(h.ps)
	}
	ps := h.ps
	var fresh []string
	var wait []chan struct{}
	for _, ch := range channels {
		if h.subs[ch] == nil {
			h.subs[ch] = map[*subscription]struct{}{}
			fresh = append(fresh, ch)
		}
		h.subs[ch][s] = struct{}{}
		if !h.confirmed[ch] {
			w := make(chan struct{})
			h.waiters[ch] = append(h.waiters[ch], w)
			wait = append(wait, w)
		}
	}
	h.mu.Unlock()
	if len(fresh) > 0 {
		if err := ps.Subscribe(ctx, fresh...); err != nil {
			s.Close()
			return nil, fmt.Errorf("jobs: subscribe: %w", err)
		}
	}
	for _, w := range wait {
		select {
		case <-w:
		case <-ctx.Done():
			s.Close()
			return nil, fmt.Errorf("jobs: subscribe: %w", context.Cause(ctx))
		}
	}
	return s, nil
}

// read fans ps's messages out until ps is closed. Subscription
// confirmations (also those after a reconnect) release the waiters.
func (h *hub) read(ps *redis.PubSub) {
	for msg := range ps.ChannelWithSubscriptions(redis.WithChannelSize(1024)) {
		h.mu.Lock()
		if h.ps != ps { // replaced after the last listener left
			h.mu.Unlock()
			continue
		}
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" && h.subs[m.Channel] != nil {
				h.confirmed[m.Channel] = true
				for _, w := range h.waiters[m.Channel] {
					close(w)
				}
				delete(h.waiters, m.Channel)
			}
		case *redis.Message:
			for s := range h.subs[m.Channel] {
				select {
				case s.C <- m:
				default: // slow listener: drop rather than stall the others
				}
			}
		}
		h.mu.Unlock()
	}
}

// Close ends the subscription: channels nobody else listens to are
// unsubscribed, and the connection closes with the last listener. C is not
// closed (the reader may still hold a reference); stop reading it.
func (s *subscription) Close() {
	s.once.Do(func() {
		h := s.h
		h.mu.Lock()
		defer h.mu.Unlock()
		var gone []string
		for _, ch := range s.channels {
			delete(h.subs[ch], s)
			if len(h.subs[ch]) == 0 {
				delete(h.subs, ch)
				delete(h.confirmed, ch)
				gone = append(gone, ch)
			}
		}
		if h.ps == nil {
			return
		}
		if len(h.subs) == 0 {
			_ = h.ps.Close()
			h.ps = nil
			h.confirmed = map[string]bool{}
			h.waiters = map[string][]chan struct{}{}
			return
		}
		if len(gone) > 0 {
			_ = h.ps.Unsubscribe(context.Background(), gone...)
		}
	})
}
