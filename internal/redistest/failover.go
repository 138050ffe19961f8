package redistest

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Masters returns the running nodes that serve slots now.
func (c *Cluster) Masters(ctx context.Context) ([]*Server, error) {
	live := c.live()
	if len(live) == 0 {
		return nil, fmt.Errorf("redistest: no node of the cluster is running")
	}
	var lastErr error
	for _, s := range live {
		nodes, err := clusterNodes(ctx, s.Addr())
		if err != nil {
			lastErr = err
			continue
		}
		var out []*Server
		for _, n := range nodes {
			if n.flags["master"] && n.slots && !n.flags["fail"] && !n.flags["fail?"] {
				if m := c.node(n.addr); m != nil && m.running() {
					out = append(out, m)
				}
			}
		}
		return out, nil
	}
	return nil, fmt.Errorf("redistest: CLUSTER NODES: %w", lastErr)
}

// FailOver kills dead, a master, waits until the cluster serves every
// slot again from the other nodes (a replica promoted), and starts dead
// again (it rejoins as a replica of its successor). It returns how long
// the cluster took to heal. The cluster must have replicas
// (StartClusterWithReplicas), and dead's replica be in sync.
func (c *Cluster) FailOver(t T, dead *Server, timeout time.Duration) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	addr := dead.Addr()
	killed := time.Now()
	dead.Kill()
	for {
		err := c.checkHealed(ctx, addr)
		if err == nil {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("redistest: cluster not healed within %s after %s was killed: %v%s", timeout, addr, err, c.logs())
		case <-time.After(clusterPollStep):
		}
	}
	took := time.Since(killed)
	dead.Restart(t)
	if err := c.waitReplicas(ctx); err != nil {
		t.Fatalf("redistest: after %s came back: %v%s", addr, err, c.logs())
	}
	return took
}

// checkHealed reports nil once every running node but dead sees the
// cluster ok and no slot on dead.
func (c *Cluster) checkHealed(ctx context.Context, dead string) error {
	for _, s := range c.live() {
		addr := s.Addr()
		if addr == dead {
			continue
		}
		info, err := clusterInfo(ctx, addr)
		if err != nil {
			return fmt.Errorf("%s: %w", addr, err)
		}
		if info["cluster_state"] != "ok" || info["cluster_slots_ok"] != "16384" {
			return fmt.Errorf("%s: cluster_state=%q slots_ok=%q", addr, info["cluster_state"], info["cluster_slots_ok"])
		}
		nodes, err := clusterNodes(ctx, addr)
		if err != nil {
			return fmt.Errorf("%s: %w", addr, err)
		}
		for _, n := range nodes {
			if n.addr == dead && n.slots {
				return fmt.Errorf("%s still sees slots on %s", addr, dead)
			}
		}
	}
	return nil
}

// FailOver kills the primary, waits until the Sentinels have promoted a
// replica that answers as master, starts the dead server again and waits
// until the Sentinels have made it a replica in sync with the new primary
// (restarted empty, it comes up as a master of nothing; promoted by a
// next failover before that, it would lose every key). It returns the
// dead primary's address and how long the promotion took.
func (st *Sentinels) FailOver(t T, timeout time.Duration) (string, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	addr, err := st.MasterAddr(ctx)
	if err != nil {
		t.Fatalf("redistest: FailOver: %v", err)
	}
	dead := st.Server(addr)
	if dead == nil {
		t.Fatalf("redistest: FailOver: the Sentinels name %s, not one of this topology's servers", addr)
	}
	killed := time.Now()
	dead.Kill()
	if _, err := st.WaitPromoted(ctx, addr); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	took := time.Since(killed)
	dead.Restart(t)
	if err := waitInSync(ctx, dead.Addr()); err != nil {
		t.Fatalf("redistest: %s back as a replica: %v", addr, err)
	}
	return addr, took
}

// waitInSync polls until addr is a replica whose link to its master is up
// and whose initial sync is done.
func waitInSync(ctx context.Context, addr string) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: time.Second, ReadTimeout: time.Second})
	defer c.Close()
	var last map[string]string
	for {
		if info, err := c.Info(ctx, "replication").Result(); err == nil {
			last = infoFields(info)
			if last["role"] == "slave" && last["master_link_status"] == "up" && last["master_sync_in_progress"] == "0" {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not in sync: %w (last: role=%s link=%s sync=%s)", ctx.Err(), last["role"], last["master_link_status"], last["master_sync_in_progress"])
		case <-time.After(50 * time.Millisecond):
		}
	}
}
