//go:build linux

// Network faults: a toxiproxy proxy between each runner and each Redis
// data node, and the faults made on them.

package chaos

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// Network faults (Report.FaultsByKind). Each is made on every proxy of one
// runner (its connections to every data node) and then taken away; the
// other runners, the Sentinels and the harness's own client are never in
// the way. The lease TTL of a chaos run is 1 s.
const (
	// FaultNetLatency delays every reply to one runner by 350–600 ms (more
	// than a third of the TTL) for 2–4 s: renewals come back late.
	FaultNetLatency = "netLatency"
	// FaultNetRepliesLost drops every reply to one runner for 1.5–3 s while
	// its commands still reach Redis: a grant, a checkpoint, a finish that
	// happened but was never confirmed (ambiguous outcomes). Its
	// connections are then reset.
	FaultNetRepliesLost = "netRepliesLost"
	// FaultNetCommandsLost drops every command of one runner for 1.5–3 s
	// (the other direction): its renewals never arrive and its leases
	// expire while it runs. Its connections are then reset.
	FaultNetCommandsLost = "netCommandsLost"
	// FaultNetPartition cuts one runner off from every data node, both
	// ways, for 2–3.5 s, then resets its connections.
	FaultNetPartition = "netPartition"
	// FaultNetResetPeer resets one runner's connections mid-command (TCP
	// RST, 0–200 ms after the first byte of a command) for 0.5–1 s.
	FaultNetResetPeer = "netResetPeer"
	// FaultNetBandwidth limits what one runner receives to 16 KB/s for 3 s.
	FaultNetBandwidth = "netBandwidth"
)

// NetFaultKinds are the network faults, in the order reports show them.
func NetFaultKinds() []string {
	kinds := FaultKinds()
	return kinds[slices.Index(kinds, FaultNetLatency):]
}

// addressMapEnv carries a runner's proxies to its config (redis.addressMap).
const addressMapEnv = "TASKLEASE_REDIS_ADDRESS_MAP"

// network is the proxies: one per (runner id, data node), kept across the
// runner's incarnations.
type network struct {
	srv   *toxiproxy.ApiServer
	nodes []string // the data nodes' addresses, as Redis announces them

	mu      sync.Mutex
	proxies map[string][]*toxiproxy.Proxy // runner id → one per node, in nodes' order
}

func newNetwork(nodes []string) *network {
	return &network{srv: toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop()),
		nodes: slices.Clone(nodes), proxies: map[string][]*toxiproxy.Proxy{}}
}

// env is the environment that routes runner id's connections to the data
// nodes through its proxies (started on first use).
func (n *network) env(id string) (string, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	ps, ok := n.proxies[id]
	if !ok {
		for _, node := range n.nodes {
			p := toxiproxy.NewProxy(n.srv, id+"→"+node, "127.0.0.1:0", node)
			if err := n.srv.Collection.Add(p, true); err != nil {
				return "", fmt.Errorf("proxy %s: %w", p.Name, err)
			}
			ps = append(ps, p)
		}
		n.proxies[id] = ps
	}
	pairs := make([]string, len(ps))
	for i, p := range ps {
		pairs[i] = fmt.Sprintf("%q: %q", n.nodes[i], p.Listen)
	}
	return addressMapEnv + "=" + strings.Join(pairs, ", "), nil
}

// toxic is one toxiproxy toxic, as its API takes it.
type toxic struct {
	kind, stream string
	attrs        string // the attributes' JSON object
}

// netFault is a fault picked for one runner: its toxics, how long they
// stay, and whether the connections are reset when they go (a fault
// that dropped bytes leaves streams no TCP peer would see, so they are
// closed, as a real network's would time out).
type netFault struct {
	kind   string
	toxics []toxic
	d      time.Duration
	reset  bool
}

func pickNetFault(kind string, rng *rand.Rand) netFault {
	between := func(lo, hi int) time.Duration { return time.Duration(lo+rng.IntN(hi-lo+1)) * time.Millisecond }
	drop := func(stream string) toxic { return toxic{kind: "timeout", stream: stream, attrs: `{"timeout": 0}`} }
	switch kind {
	case FaultNetLatency:
		lat := 350 + rng.IntN(251)
		return netFault{kind: kind, d: between(2000, 4000),
			toxics: []toxic{{kind: "latency", stream: "downstream", attrs: fmt.Sprintf(`{"latency": %d, "jitter": 50}`, lat)}}}
	case FaultNetRepliesLost:
		return netFault{kind: kind, d: between(1500, 3000), reset: true, toxics: []toxic{drop("downstream")}}
	case FaultNetCommandsLost:
		return netFault{kind: kind, d: between(1500, 3000), reset: true, toxics: []toxic{drop("upstream")}}
	case FaultNetPartition:
		return netFault{kind: kind, d: between(2000, 3500), reset: true, toxics: []toxic{drop("upstream"), drop("downstream")}}
	case FaultNetResetPeer:
		return netFault{kind: kind, d: between(500, 1000),
			toxics: []toxic{{kind: "reset_peer", stream: "upstream", attrs: fmt.Sprintf(`{"timeout": %d}`, rng.IntN(201))}}}
	default: // FaultNetBandwidth
		return netFault{kind: FaultNetBandwidth, d: 3 * time.Second,
			toxics: []toxic{{kind: "bandwidth", stream: "downstream", attrs: `{"rate": 16}`}}}
	}
}

// apply makes f on runner id's proxies, waits f.d, and takes it away.
func (n *network) apply(id string, f netFault) error {
	if err := n.inject(id, f); err != nil {
		return err
	}
	time.Sleep(f.d)
	return n.heal(id, f)
}

// inject puts f's toxics on runner id's proxies.
func (n *network) inject(id string, f netFault) error {
	for _, p := range n.proxiesOf(id) {
		for i, tx := range f.toxics {
			body := fmt.Sprintf(`{"name": "%s%d", "type": %q, "stream": %q, "attributes": %s}`, f.kind, i, tx.kind, tx.stream, tx.attrs)
			if _, err := p.Toxics.AddToxicJson(strings.NewReader(body)); err != nil {
				return fmt.Errorf("%s on %s: %w", f.kind, p.Name, err)
			}
		}
	}
	return nil
}

// heal takes f's toxics away, first resetting the connections when f
// dropped bytes.
func (n *network) heal(id string, f netFault) error {
	var errs []error
	for _, p := range n.proxiesOf(id) {
		if f.reset {
			p.Stop() // closes every connection through it
		}
		for i := range f.toxics {
			if err := p.Toxics.RemoveToxic(context.Background(), fmt.Sprintf("%s%d", f.kind, i)); err != nil {
				errs = append(errs, err)
			}
		}
		if f.reset {
			if err := restart(p); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("taking %s away: %v", f.kind, errs)
	}
	return nil
}

func (n *network) proxiesOf(id string) []*toxiproxy.Proxy {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.proxies[id]
}

// restart starts a stopped proxy on the address it had: the runner's
// config names it. Another process may have taken the port meanwhile (a
// few milliseconds): retried briefly.
func restart(p *toxiproxy.Proxy) error {
	var err error
	for range 50 {
		if err = p.Start(); err == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("restart proxy %s on %s: %w", p.Name, p.Listen, err)
}

// close stops every proxy.
func (n *network) close() {
	_ = n.srv.Collection.Clear()
}

// netFaultLoop makes the network faults until ctx ends: every 1.5–4 s one
// of h.netFaults on one runner picked at random, with choices of its own
// seeded by the run's seed (the other faults' choices stay as they were).
func (h *harness) netFaultLoop(ctx context.Context) {
	rng := rand.New(rand.NewPCG(uint64(h.seed), 2))
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Duration(1500+rng.IntN(2500)) * time.Millisecond):
		}
		cur := h.current()
		p := cur[rng.IntN(len(cur))]
		f := pickNetFault(h.netFaults[rng.IntN(len(h.netFaults))], rng)
		h.logf("network fault %s on %s for %v", f.kind, p.id, f.d)
		if err := h.net.apply(p.id, f); err != nil {
			h.note("network fault: %v", err)
			continue
		}
		h.mu.Lock()
		h.netMade[f.kind]++
		h.mu.Unlock()
	}
}
