package jobs

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/taskkey"
)

// stageStart is one attempt of a stage, as the stage saw it.
type stageStart struct {
	subject string
	token   int64
	attempt int
	at      time.Time
}

// TestRunResumesAfterMasterFailover: on a cluster with replicas, SIGKILL
// the master holding a running key. Once the cluster has promoted the
// replica, calls succeed again at once, the run resumes on the promoted
// master within the cluster's failover time + the lease TTL + 2 s of the
// kill with a higher fencing token, and ends done; the runner's cancel
// channel of that partition is subscribed again, and a new request there
// is picked up. go-redis alone keeps the dead master's slots for up to a
// minute (see internal/slotmap).
func TestRunResumesAfterMasterFailover(t *testing.T) {
	cl := redistest.StartClusterWithReplicas(t)
	rdb := cl.Client(t)
	ctx := context.Background()
	const ttl = 2 * time.Second

	var mu sync.Mutex
	var starts []stageStart
	started := make(chan stageStart, 8)
	stage := HandlerFunc(func(ctx context.Context, run *Run) error {
		s := stageStart{subject: run.Subject(), token: run.FencingToken(), attempt: run.Attempt(), at: time.Now()}
		mu.Lock()
		starts = append(starts, s)
		first := len(starts) == 1
		mu.Unlock()
		started <- s
		if first {
			<-ctx.Done() // until the lease goes with its master
			return context.Cause(ctx)
		}
		return nil
	})
	e := newEnv(t, rdb, Config{Prefix: "fo", Jobs: []Job{clJob("backup", Stage{Name: "dump", Handler: stage})}})
	// The production fetch block, so a read blocked on the dying master is
	// part of what is measured.
	e.startRunner(RunnerConfig{ID: "fo", Concurrency: 4, LeaseTTL: ttl, FetchBlock: FetchBlockDefault})

	clSubmit(t, e.reg, "u1", "backup", SourceManual, "")
	first := waitStart(t, started, 20*time.Second, "the first attempt")

	k := taskkey.MustNew("u1", "backup")
	p := e.reg.ks.Partition(k)
	master := cl.MasterOf(t, e.reg.ks.Task(k))
	waitReplicated(t, master.Addr(), e.reg.ks.Task(k)+":replicated")
	killed := time.Now()
	master.Kill()
	promoted := cl.WaitFailover(t, master, 30*time.Second)
	ok := time.Now()
	failover := ok.Sub(killed)
	t.Logf("killed master %s; cluster ok with %s promoted %s after the kill", master.Addr(), promoted.Addr(), ms(failover))

	// Calls answer again as soon as the cluster does.
	got := pollUntil(t, ok.Add(10*time.Second), "Registry.Get to answer", func() error {
		_, err := e.reg.Get(ctx, "u1", "backup")
		return err
	})
	t.Logf("Registry.Get answered %s after the cluster was ok", ms(got.Sub(ok)))
	if d := got.Sub(ok); d > 2*time.Second {
		t.Errorf("Registry.Get failed for %s after the cluster was ok, want at most 2s", ms(d))
	}

	budget := failover + ttl + 2*time.Second
	second := waitStart(t, started, time.Until(killed.Add(budget+30*time.Second)), "the run to resume")
	t.Logf("run resumed %s after the kill (%s after the cluster was ok); budget %s = failover %s + TTL %s + 2s",
		ms(second.at.Sub(killed)), ms(second.at.Sub(ok)), ms(budget), ms(failover), ttl)
	if d := second.at.Sub(killed); d > budget {
		t.Errorf("run resumed %s after the kill, want at most %s", ms(d), ms(budget))
	}
	if second.subject != "u1" || second.token <= first.token || second.attempt != first.attempt+1 {
		t.Errorf("resumed attempt %+v after %+v: want u1's next attempt with a higher fencing token", second, first)
	}
	if v := e.waitStatus("u1", "backup", 10*time.Second, StatusDone, StatusFailed, StatusCancelled); v.Status != StatusDone || v.FencingToken != second.token {
		t.Fatalf("u1: %s with token %d (%s), want done with token %d", v.Status, v.FencingToken, v.LastError, second.token)
	}
	if owner := cl.MasterOf(t, e.reg.ks.Task(k)); owner != promoted {
		t.Errorf("u1's slot is served by %s, want the promoted %s", owner.Addr(), promoted.Addr())
	}

	// The runner's cancel channel of the partition is subscribed again,
	// on a live node (on a Redis 7 Cluster: SSUBSCRIBE, so the promoted master).
	resub := pollUntil(t, ok.Add(10*time.Second), "the cancel channel to be subscribed again", func() error {
		return subscribedOnLive(ctx, cl, master, e.reg.ks.Cancels(p))
	})
	t.Logf("cancel channel of partition %d subscribed again %s after the cluster was ok", p, ms(resub.Sub(ok)))

	// A new request in the failed-over partition is picked up.
	subject := subjectInPartition(t, e.reg, "backup", p)
	submitted := time.Now()
	clSubmit(t, e.reg, subject, "backup", SourceManual, "")
	fresh := waitStart(t, started, 20*time.Second, "a new run in the failed-over partition")
	t.Logf("new run in partition %d started %s after its submit (%s after the cluster was ok)",
		p, ms(fresh.at.Sub(submitted)), ms(fresh.at.Sub(ok)))
	if fresh.subject != subject {
		t.Errorf("started %s, want %s", fresh.subject, subject)
	}
}

// waitStart returns the next stage start, or fails the test after d.
func waitStart(t *testing.T, started <-chan stageStart, d time.Duration, what string) stageStart {
	t.Helper()
	select {
	case s := <-started:
		return s
	case <-time.After(d):
		t.Fatalf("timed out after %s waiting for %s", ms(d), what)
		return stageStart{}
	}
}

// pollUntil polls f until it returns nil and returns when it did, or fails
// the test with f's last error at deadline.
func pollUntil(t *testing.T, deadline time.Time, what string, f func() error) time.Time {
	t.Helper()
	for {
		err := f()
		now := time.Now()
		if err == nil {
			return now
		}
		if now.After(deadline) {
			t.Fatalf("timed out waiting for %s: %v", what, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// subscribedOnLive reports (nil) whether channel is subscribed, as a shard
// or a plain channel, on a node of cl other than dead.
func subscribedOnLive(ctx context.Context, cl *redistest.Cluster, dead *redistest.Server, channel string) error {
	for _, addr := range cl.Addrs() {
		if dead != nil && addr == dead.Addr() {
			continue
		}
		c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		shard, err := c.PubSubShardChannels(ctx, channel).Result()
		if err == nil {
			var plain []string
			plain, err = c.PubSubChannels(ctx, channel).Result()
			shard = append(shard, plain...)
		}
		_ = c.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", addr, err)
		}
		if slices.Contains(shard, channel) {
			return nil
		}
	}
	return fmt.Errorf("%s is subscribed on no live node", channel)
}

// subjectInPartition returns a fresh subject whose key of scope falls in
// partition p.
func subjectInPartition(t *testing.T, reg *Registry, scope string, p int) string {
	t.Helper()
	for i := range 10000 {
		s := fmt.Sprintf("n%d", i)
		if reg.ks.Partition(taskkey.MustNew(s, scope)) == p {
			return s
		}
	}
	t.Fatalf("no subject in partition %d", p)
	return ""
}

func ms(d time.Duration) string { return d.Round(time.Millisecond).String() }

// waitReplicated returns once a replica of the Redis at addr has every write
// made so far: replication is asynchronous, and a failover right after the
// claim would otherwise lose the run itself (README, Operations). WAIT
// counts the writes of its own connection, so it follows a write of its
// own to key (on that node), whose offset covers everything before it.
func waitReplicated(t *testing.T, addr, key string) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	ctx := context.Background()
	conn := c.Conn()
	defer conn.Close()
	if err := conn.Set(ctx, key, "1", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := conn.Do(ctx, "WAIT", 1, 5000).Int(); err != nil || n < 1 {
		t.Fatalf("WAIT: %d replicas, %v", n, err)
	}
}

// TestHungMasterSubscriptionsMove: a master that hangs (SIGSTOP) instead of
// dying keeps its TCP connections open, so go-redis would wait on the
// runner's pub/sub connection to it until TCP gives up. The hub's probe
// notices that the connection stopped confirming and subscribes its
// channels again, on the promoted master, soon after the failover.
func TestHungMasterSubscriptionsMove(t *testing.T) {
	cl := redistest.StartClusterWithReplicas(t)
	// Short timeouts, as README advises against hung masters, so the
	// slot map follows the failover quickly.
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), DialTimeout: time.Second, ReadTimeout: time.Second})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	e := newEnv(t, rdb, Config{Prefix: "hm", Jobs: []Job{clJob("backup", Stage{Name: "dump", Handler: &counter{}})}})
	e.startRunner(RunnerConfig{ID: "hm", Concurrency: 4, LeaseTTL: 2 * time.Second})
	k := taskkey.MustNew("u1", "backup")
	p := e.reg.ks.Partition(k)
	master := cl.MasterOf(t, e.reg.ks.Task(k))
	pollUntil(t, time.Now().Add(10*time.Second), "the cancel channel to be subscribed", func() error {
		return subscribedOnLive(ctx, cl, nil, e.reg.ks.Cancels(p))
	})

	paused := time.Now()
	master.Pause()
	cl.WaitFailover(t, master, 30*time.Second)
	ok := time.Now()
	moved := pollUntil(t, ok.Add(hubProbeEvery+hubProbeTimeout+15*time.Second), "the cancel channel to move to a live node", func() error {
		return subscribedOnLive(ctx, cl, master, e.reg.ks.Cancels(p))
	})
	t.Logf("master paused; cluster ok %s later; partition %d's cancel channel subscribed on a live node %s after that",
		ms(ok.Sub(paused)), p, ms(moved.Sub(ok)))
	// And the partition works: a run there finishes on the promoted master.
	clSubmit(t, e.reg, "u1", "backup", SourceManual, "")
	if v := e.waitStatus("u1", "backup", 30*time.Second, StatusDone, StatusFailed, StatusCancelled); v.Status != StatusDone {
		t.Fatalf("u1: %s (%s)", v.Status, v.LastError)
	}
}
