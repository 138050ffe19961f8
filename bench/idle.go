package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/jobs"
)

// idleFleets are the fleet sizes the idle measurement runs: N pods with
// nothing to do on one Redis.
var idleFleets = []int{1, 10, 100}

// idleSettle is how long a fleet runs before its window: every pod has
// started, loaded its scripts and made its first passes (--quick: 1 s).
const idleSettle = 3 * time.Second

// idle: N idle pods on the private Redis — tasklease Runners of the
// default 16 partitions, asynq Servers with their defaults — each with a
// go-redis client of its own, as separate pods have. For a window (10 s;
// --quick 2 s) after they settle: the Redis commands per second and per
// pod (INFO commandstats, script commands included), Redis's CPU as a
// percentage of one core, and the connections per pod (INFO clients, the
// bench's own aside). Nothing is submitted.
func (b *bench) idle(rep int) error {
	window, settle := 10*time.Second, idleSettle
	if b.rep.quick {
		window, settle = 2*time.Second, time.Second
	}
	fleets := idleFleets
	if b.rep.quick {
		fleets = idleFleets[:2] // a hundred pods start and stop in about a minute
	}
	for _, n := range fleets {
		tl, err := b.idleFleet(n, settle, window, b.startIdleTasklease)
		if err != nil {
			return fmt.Errorf("tasklease, %d pods: %w", n, err)
		}
		as, err := b.idleFleet(n, settle, window, b.startIdleAsynq)
		if err != nil {
			return fmt.Errorf("asynq, %d pods: %w", n, err)
		}
		sfx := "_" + strconv.Itoa(n) + "_pods"
		b.rep.add2("idle_cmds_per_pod"+sfx, tl.cmdsPerPod, as.cmdsPerPod)
		b.rep.add2("idle_redis_cpu_pct"+sfx, tl.cpuPct, as.cpuPct)
		b.rep.add2("idle_conns_per_pod"+sfx, tl.connsPerPod, as.connsPerPod)
		b.progress("idle rep %d, %d pods: tasklease %.1f commands/s a pod, Redis CPU %.2f %%, %.1f connections a pod; asynq %.1f, %.2f %%, %.1f",
			rep, n, tl.cmdsPerPod, tl.cpuPct, tl.connsPerPod, as.cmdsPerPod, as.cpuPct, as.connsPerPod)
	}
	return nil
}

// idleFigures are one fleet's window.
type idleFigures struct {
	cmdsPerPod, cpuPct, connsPerPod float64
}

// idleFleet starts n pods with start, lets them settle, and measures a
// window; the pods are stopped before it returns.
func (b *bench) idleFleet(n int, settle, window time.Duration, start func(i int) (stop func(), err error)) (idleFigures, error) {
	if err := b.reset(); err != nil {
		return idleFigures{}, err
	}
	var stops []func()
	defer func() { // the pods stop together, as a fleet scaled to zero would
		var wg sync.WaitGroup
		for _, s := range stops {
			wg.Go(s)
		}
		wg.Wait()
	}()
	for i := range n {
		stop, err := start(i)
		if err != nil {
			return idleFigures{}, err
		}
		stops = append(stops, stop)
	}
	return b.idleWindow(n, settle, window, podClientName)
}

// idleWindow measures n idle pods already started: it lets them settle,
// then takes the window's commands, CPU and the pods' connections.
func (b *bench) idleWindow(n int, settle, window time.Duration, connName string) (idleFigures, error) {
	var f idleFigures
	time.Sleep(settle)
	before, err := takeSnapshot(b.ctx, b.admin)
	if err != nil {
		return f, err
	}
	t0 := time.Now()
	time.Sleep(window)
	after, err := takeSnapshot(b.ctx, b.admin)
	if err != nil {
		return f, err
	}
	elapsed := time.Since(t0).Seconds()
	conns, err := b.podConnections(connName)
	if err != nil {
		return f, err
	}
	f.cmdsPerPod = float64(after.calls-before.calls) / elapsed / float64(n)
	f.cpuPct = 100 * (after.cpu - before.cpu).Seconds() / elapsed
	f.connsPerPod = float64(conns) / float64(n)
	return f, nil
}

// podConnections counts the pods' connections to the private Redis
// (CLIENT LIST, by the pods' client name: not the bench's own clients';
// name "": every connection but the bench's admin client's, for a peer
// that names its connections itself).
func (b *bench) podConnections(name string) (int, error) {
	list, err := b.admin.ClientList(b.ctx).Result()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(list), "\n") {
		switch {
		case name != "" && strings.Contains(line, " name="+name+" "):
			n++
		case name == "" && !strings.Contains(line, " name=bench-admin "):
			n++
		}
	}
	return n, nil
}

// podClientName names the idle pods' connections, which the idle
// measurement counts.
const podClientName = "bench-pod"

// idlePodClient is a pod's own client, as a runner serve without
// redis.poolSize has it: go-redis's defaults (the pool opens what it
// uses) but for the idle timeout runner serve sets (jobs.PoolIdleTimeout).
// asynq's servers get the same client.
func (b *bench) idlePodClient() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: b.addr, ClientName: podClientName, DisableIdentity: true,
		PoolFIFO: true, ConnMaxIdleTime: jobs.PoolIdleTimeout})
}

func (b *bench) startIdleTasklease(i int) (func(), error) {
	rdb := b.idlePodClient()
	reg, err := jobs.NewRegistry(rdb, jobs.Config{Logger: discard, Jobs: []jobs.Job{{Scope: scope, Stages: stageHandlers(1, nil)}}})
	if err != nil {
		rdb.Close()
		return nil, err
	}
	rn, err := jobs.NewRunner(reg, jobs.RunnerConfig{ID: "idle-" + strconv.Itoa(i), Concurrency: concurrency, ShutdownGrace: time.Second})
	if err != nil {
		rdb.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- rn.Run(ctx) }()
	return func() {
		cancel()
		<-done
		rdb.Close()
	}, nil
}

func (b *bench) startIdleAsynq(int) (func(), error) {
	rdb := b.idlePodClient()
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{Concurrency: concurrency, Logger: asynqDiscard{}, LogLevel: asynq.FatalLevel})
	if err := srv.Start(asynq.HandlerFunc(func(context.Context, *asynq.Task) error { return nil })); err != nil {
		rdb.Close()
		return nil, fmt.Errorf("asynq server: %w", err)
	}
	return func() {
		srv.Shutdown()
		rdb.Close()
	}, nil
}
