package jobs

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// hubBuffer is each subscription's message buffer. A reader that falls this
// far behind loses messages instead of stalling everyone else; view
// subscribers re-read with Get and the runner's heartbeat returns the cancel
// flag, so nothing depends on every message arriving.
const hubBuffer = 256

// A connection is probed every hubProbeEvery: one of its channels is
// subscribed again, which Redis confirms. One that has confirmed nothing
// for hubProbeEvery + hubProbeTimeout is replaced by a new connection: its
// node hangs (SIGSTOP, a network partition) and go-redis would go on
// waiting for it until TCP gives up, long after a failover moved the
// channels' slot to another node.
const (
	hubProbeEvery   = 5 * time.Second
	hubProbeTimeout = 5 * time.Second
)

// hub shares Redis pub/sub connections among every subscriber of a
// Registry — SSE clients, dashboards, the runner's cancel listener — and
// fans messages out in Go, so 200 dashboard tabs cost one Redis connection,
// not 200. Redis channels are subscribed while someone listens.
//
// With plain pub/sub (a single Redis, Sentinel, or a Cluster without
// Redis 7) one connection carries every channel. With sharded pub/sub (a
// Redis 7 Cluster, whose scripts SPUBLISH: see lua.LibraryOptions) a
// channel is subscribed (SSUBSCRIBE) on the master of its slot: one
// connection per partition hash tag, so events reach only that master.
// Connections open with their first channel and close with their last.
type hub struct {
	rdb     redis.UniversalClient
	sharded func(context.Context) (bool, error) // asked at the first subscription; nil: never sharded

	mu        sync.Mutex
	mode      hubMode
	conns     map[string]*redis.PubSub              // by shard ("" when not sharded)
	seen      map[*redis.PubSub]time.Time           // last confirmation or message per connection
	subs      map[string]map[*subscription]struct{} // channel → listeners
	confirmed map[string]bool                       // channel subscribed, per Redis
	waiters   map[string][]chan struct{}            // closed when the channel is confirmed
}

// hubMode is how the hub subscribes.
type hubMode int

const (
	hubUndecided hubMode = iota
	hubPlain             // SUBSCRIBE on one connection
	hubSharded           // SSUBSCRIBE, a connection per slot
)

// subscription is one listener's view of the hub.
type subscription struct {
	h        *hub
	channels []string
	C        chan *redis.Message
	once     sync.Once
}

func newHub(rdb redis.UniversalClient, sharded func(context.Context) (bool, error)) *hub {
	return &hub{rdb: rdb, sharded: sharded, conns: map[string]*redis.PubSub{}, seen: map[*redis.PubSub]time.Time{},
		subs:      map[string]map[*subscription]struct{}{},
		confirmed: map[string]bool{}, waiters: map[string][]chan struct{}{}}
}

// shardOf names the connection a channel is subscribed on: its hash tag
// when sharded (all of a partition's channels share one), else "".
func (h *hub) shardOf(channel string) string {
	if h.mode != hubSharded {
		return ""
	}
	if i := strings.IndexByte(channel, '{'); i >= 0 {
		if j := strings.IndexByte(channel[i+1:], '}'); j > 0 {
			return channel[i+1 : i+1+j]
		}
	}
	return channel
}

// subscribe registers a listener for channels and returns once Redis has
// confirmed every one of them, so nothing published afterwards is missed.
func (h *hub) subscribe(ctx context.Context, channels []string) (*subscription, error) {
	s := &subscription{h: h, channels: channels, C: make(chan *redis.Message, hubBuffer)}
	sharded := false
	if h.sharded != nil {
		h.mu.Lock()
		undecided := h.mode == hubUndecided
		h.mu.Unlock()
		if undecided {
			var err error
			if sharded, err = h.sharded(ctx); err != nil { // may talk to Redis: not under mu
				return nil, fmt.Errorf("jobs: subscribe: %w", err)
			}
		}
	}
	h.mu.Lock()
	if h.mode == hubUndecided {
		h.mode = hubPlain
		if sharded {
			h.mode = hubSharded
		}
	}
	fresh := map[*redis.PubSub][]string{}
	opened := map[*redis.PubSub]string{} // new connections → their shard
	var wait []chan struct{}
	for _, ch := range channels {
		if h.subs[ch] == nil {
			h.subs[ch] = map[*subscription]struct{}{}
			shard := h.shardOf(ch)
			ps := h.conns[shard]
			if ps == nil {
				ps = h.openLocked(ctx, shard)
				opened[ps] = shard
			}
			fresh[ps] = append(fresh[ps], ch)
		}
		h.subs[ch][s] = struct{}{}
		if !h.confirmed[ch] {
			w := make(chan struct{})
			h.waiters[ch] = append(h.waiters[ch], w)
			wait = append(wait, w)
		}
	}
	h.mu.Unlock()
	for ps, chans := range fresh {
		err := h.subscribeOn(ctx, ps, chans...)
		if shard, ok := opened[ps]; ok {
			// Only now: a reader started before the first SSUBSCRIBE would
			// connect the Cluster client's PubSub to a random node.
			go h.read(shard, ps)
			go h.probe(shard, ps)
		}
		if err != nil {
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

// openLocked registers a new connection for shard; it connects with its
// first (S)SUBSCRIBE — on a Cluster to the master of that channel's slot —
// and its reader starts after that. The caller holds mu.
func (h *hub) openLocked(ctx context.Context, shard string) *redis.PubSub {
	var ps *redis.PubSub
	if h.mode == hubSharded {
		ps = h.rdb.SSubscribe(context.WithoutCancel(ctx))
	} else {
		ps = h.rdb.Subscribe(context.WithoutCancel(ctx))
	}
	h.conns[shard] = ps
	h.seen[ps] = time.Now() // the probe's clock starts with the connection
	return ps
}

// read fans ps's messages out until ps is closed. Subscription
// confirmations (also those after a reconnect) release the waiters.
func (h *hub) read(shard string, ps *redis.PubSub) {
	for msg := range ps.ChannelWithSubscriptions(redis.WithChannelSize(1024)) {
		h.mu.Lock()
		if h.conns[shard] != ps { // replaced after its last listener left
			h.mu.Unlock()
			continue
		}
		h.seen[ps] = time.Now()
		switch m := msg.(type) {
		case *redis.Subscription:
			if (m.Kind == "subscribe" || m.Kind == "ssubscribe") && h.subs[m.Channel] != nil {
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

// subscribeOn (S)SUBSCRIBEs chans on ps, as the hub's mode says.
func (h *hub) subscribeOn(ctx context.Context, ps *redis.PubSub, chans ...string) error {
	h.mu.Lock()
	sharded := h.mode == hubSharded
	h.mu.Unlock()
	if sharded {
		return ps.SSubscribe(ctx, chans...)
	}
	return ps.Subscribe(ctx, chans...)
}

// probe checks ps every hubProbeEvery until it is replaced or closed, and
// replaces it when it stopped answering (see hubProbeEvery).
func (h *hub) probe(shard string, ps *redis.PubSub) {
	tick := time.NewTicker(hubProbeEvery)
	defer tick.Stop()
	for range tick.C {
		h.mu.Lock()
		if h.conns[shard] != ps {
			h.mu.Unlock()
			return
		}
		var ch string
		for c := range h.subs {
			if h.shardOf(c) == shard {
				ch = c
				break
			}
		}
		last := h.seen[ps]
		h.mu.Unlock()
		if ch == "" {
			continue
		}
		if time.Since(last) > hubProbeEvery+hubProbeTimeout {
			h.replace(shard, ps)
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), hubProbeTimeout)
		_ = h.subscribeOn(ctx, ps, ch) // its confirmation is the answer
		cancel()
	}
}

// replace closes ps, which stopped answering, and subscribes its channels
// on a new connection (on a Cluster, to their slot's master now).
// Messages published meanwhile are lost, as across any reconnect: views
// are re-read, and the heartbeat returns the cancel flag.
func (h *hub) replace(shard string, ps *redis.PubSub) {
	h.mu.Lock()
	if h.conns[shard] != ps {
		h.mu.Unlock()
		return
	}
	var chans []string
	for c := range h.subs {
		if h.shardOf(c) == shard {
			chans = append(chans, c)
		}
	}
	delete(h.conns, shard)
	delete(h.seen, ps)
	var fresh *redis.PubSub
	if len(chans) > 0 {
		fresh = h.openLocked(context.Background(), shard)
	}
	h.mu.Unlock()
	_ = ps.Close()
	if fresh == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), hubProbeTimeout)
	_ = h.subscribeOn(ctx, fresh, chans...) // if this fails too, its probe replaces it again
	cancel()
	go h.read(shard, fresh)
	go h.probe(shard, fresh)
}

// Close ends the subscription: channels nobody else listens to are
// unsubscribed, and a connection closes with its last channel. C is not
// closed (the reader may still hold a reference); stop reading it.
func (s *subscription) Close() {
	s.once.Do(func() {
		h := s.h
		h.mu.Lock()
		defer h.mu.Unlock()
		gone := map[string][]string{} // shard → channels nobody listens to any more
		for _, ch := range s.channels {
			delete(h.subs[ch], s)
			if len(h.subs[ch]) == 0 {
				delete(h.subs, ch)
				delete(h.confirmed, ch)
				delete(h.waiters, ch)
				gone[h.shardOf(ch)] = append(gone[h.shardOf(ch)], ch)
			}
		}
		for shard, chans := range gone {
			ps := h.conns[shard]
			if ps == nil {
				continue
			}
			if !h.shardInUseLocked(shard) {
				_ = ps.Close()
				delete(h.conns, shard)
				delete(h.seen, ps)
				continue
			}
			if h.mode == hubSharded {
				_ = ps.SUnsubscribe(context.Background(), chans...)
			} else {
				_ = ps.Unsubscribe(context.Background(), chans...)
			}
		}
	})
}

// shardInUseLocked reports whether any channel of shard has listeners.
func (h *hub) shardInUseLocked(shard string) bool {
	for ch := range h.subs {
		if h.shardOf(ch) == shard {
			return true
		}
	}
	return false
}
