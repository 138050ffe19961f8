package redistest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// SentinelMaster is the master name the Sentinels of StartSentinel monitor.
const SentinelMaster = "tasklease"

// Sentinel timings: a primary unreachable for DefaultSentinelDownAfter is
// declared down and a replica promoted (about 2 s on this machine).
const (
	DefaultSentinelDownAfter = 1000 * time.Millisecond
	sentinelFailoverTimeout  = 5000 * time.Millisecond
	sentinelQuorum           = 2
	sentinelCount            = 3
)

// SentinelOptions tune StartSentinelWith.
type SentinelOptions struct {
	// DownAfter is the Sentinels' down-after-milliseconds;
	// DefaultSentinelDownAfter when zero. A primary held in CLIENT PAUSE
	// WRITE under load stops answering the Sentinels' PINGs (they queue
	// behind its blocked hello PUBLISH), so a test that pauses for d needs
	// DownAfter well above d, or the Sentinels fail the primary over.
	DownAfter time.Duration
	// Clocks runs each data server (the primary and the replicas, not the
	// Sentinels) on a Clock of its own (Server.Clock), offset 0 at start.
	Clocks bool
}

// sentinelReplicas is how many replicas StartSentinel gives the primary:
// with two, a second failover still finds a replica to promote.
const sentinelReplicas = 2

// Sentinels is a primary, its replicas and three Sentinels on loopback
// ports.
type Sentinels struct {
	Primary   *Server
	Replicas  []*Server
	sentinels []*Server
}

// StartSentinel starts a primary, two replicas of it and three Sentinels
// (`redis-server --sentinel`, quorum 2) and waits until the Sentinels see
// each other and the replicas are in sync. It skips without redis-server
// unless TASKLEASE_REQUIRE_REDIS=1; everything is stopped when the test
// ends.
func StartSentinel(t T) *Sentinels {
	t.Helper()
	return StartSentinelWith(t, SentinelOptions{})
}

// StartSentinelWith is StartSentinel with opts.
func StartSentinelWith(t T, opts SentinelOptions) *Sentinels {
	t.Helper()
	downAfter := opts.DownAfter
	if downAfter <= 0 {
		downAfter = DefaultSentinelDownAfter
	}
	bin := requireBinary(t, "redis-server")
	dir := t.TempDir()
	st := &Sentinels{}
	var cs clocks
	clocked := func(s *Server) *Server {
		if opts.Clocks {
			cs.give(t, s)
		}
		return s
	}
	st.Primary = clocked(newServer(t, bin, dir, nil))
	st.Primary.startOnFreePort(t, func(t T) int { return FreePort(t) })
	primary := st.Primary.Addr()
	for range sentinelReplicas {
		r := clocked(newServer(t, bin, dir, func(int) []string {
			return []string{"--replicaof", "127.0.0.1", strconv.Itoa(st.Primary.port)}
		}))
		r.startOnFreePort(t, func(t T) int { return FreePort(t) })
		st.Replicas = append(st.Replicas, r)
	}
	for i := range sentinelCount {
		s := newServer(t, bin, dir, func(int) []string { return []string{"--sentinel"} })
		s.confFile = func(port int) (string, error) {
			conf := filepath.Join(dir, fmt.Sprintf("sentinel-%d-%d.conf", i, port))
			body := fmt.Sprintf("sentinel monitor %s 127.0.0.1 %d %d\n"+
				"sentinel down-after-milliseconds %s %d\nsentinel failover-timeout %s %d\n",
				SentinelMaster, st.Primary.port, sentinelQuorum,
				SentinelMaster, downAfter.Milliseconds(), SentinelMaster, sentinelFailoverTimeout.Milliseconds())
			return conf, os.WriteFile(conf, []byte(body), 0o600)
		}
		s.startOnFreePort(t, func(t T) int { return FreePort(t) })
		st.sentinels = append(st.sentinels, s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := st.waitReady(ctx); err != nil {
		t.Fatalf("redistest: sentinels of %s not ready: %v", primary, err)
	}
	return st
}

// SentinelAddrs returns the Sentinels' addresses.
func (st *Sentinels) SentinelAddrs() []string { return addrsOf(st.sentinels) }

// Client returns a Sentinel-backed failover client, closed when t ends.
func (st *Sentinels) Client(t T) *redis.Client {
	t.Helper()
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: SentinelMaster, SentinelAddrs: st.SentinelAddrs()})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// MasterAddr asks a Sentinel which address is the primary now.
func (st *Sentinels) MasterAddr(ctx context.Context) (string, error) {
	var lastErr error
	for _, s := range st.sentinels {
		c := redis.NewSentinelClient(&redis.Options{Addr: s.Addr()})
		addr, err := c.GetMasterAddrByName(ctx, SentinelMaster).Result()
		_ = c.Close()
		if err == nil && len(addr) == 2 {
			return addr[0] + ":" + addr[1], nil
		}
		lastErr = err
	}
	return "", fmt.Errorf("redistest: no sentinel knows the master: %v", lastErr)
}

// Failovers returns how many failovers the Sentinels have made since they
// started: the master's config-epoch, which each failover bumps by one
// (the highest any Sentinel reports).
func (st *Sentinels) Failovers(ctx context.Context) (int64, error) {
	var (
		best    int64 = -1
		lastErr error
	)
	for _, s := range st.sentinels {
		c := redis.NewSentinelClient(&redis.Options{Addr: s.Addr()})
		m, err := c.Master(ctx, SentinelMaster).Result()
		_ = c.Close()
		if err != nil {
			lastErr = err
			continue
		}
		n, err := strconv.ParseInt(m["config-epoch"], 10, 64)
		if err != nil {
			lastErr = fmt.Errorf("config-epoch %q: %w", m["config-epoch"], err)
			continue
		}
		best = max(best, n)
	}
	if best < 0 {
		return 0, fmt.Errorf("redistest: no sentinel reports the master: %v", lastErr)
	}
	return best, nil
}

// Server returns the primary or replica listening on addr, nil if none.
func (st *Sentinels) Server(addr string) *Server {
	for _, s := range append([]*Server{st.Primary}, st.Replicas...) {
		if s.Addr() == addr {
			return s
		}
	}
	return nil
}

// WaitPromoted polls until the Sentinels name a primary other than dead
// and that server answers as a master; it returns the new primary.
func (st *Sentinels) WaitPromoted(ctx context.Context, dead string) (*Server, error) {
	for {
		if addr, err := st.MasterAddr(ctx); err == nil && addr != dead {
			if s := st.Server(addr); s != nil {
				c := redis.NewClient(&redis.Options{Addr: addr})
				info, err := c.Info(ctx, "replication").Result()
				_ = c.Close()
				if err == nil && infoFields(info)["role"] == "master" {
					return s, nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("redistest: no replica of %s promoted: %w", dead, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// waitReady polls until every Sentinel knows the other two and every
// replica reports its link to the primary up.
func (st *Sentinels) waitReady(ctx context.Context) error {
	var reps []*redis.Client
	for _, r := range st.Replicas {
		c := redis.NewClient(&redis.Options{Addr: r.Addr()})
		defer c.Close()
		reps = append(reps, c)
	}
	for {
		ready := true
		for _, s := range st.sentinels {
			c := redis.NewSentinelClient(&redis.Options{Addr: s.Addr()})
			others, err := c.Sentinels(ctx, SentinelMaster).Result()
			_ = c.Close()
			if err != nil || len(others) < sentinelCount-1 {
				ready = false
			}
		}
		for _, rep := range reps {
			if info, err := rep.Info(ctx, "replication").Result(); err != nil || infoFields(info)["master_link_status"] != "up" {
				ready = false
			}
		}
		if ready {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}
