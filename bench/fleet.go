package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/jobs"
)

// The fleet: 100 tasklease Runners on one Redis, each with a go-redis
// client of its own (as separate pods have), in this process.
const (
	fleetPods = 100
	// fleetPodConcurrency: a pod's slots in the pick-up and takeover
	// windows, so a fleet has room for the runs of the pods killed.
	fleetPodConcurrency = 2
	// fleetE2EConcurrency is the total concurrency of both sides of
	// e2e_1stage_100_pods: one Runner of 100 against 100 of 1.
	fleetE2EConcurrency = 100
	// fleetLeaseTTL is the pods' lease TTL: takeover is bounded by it,
	// and 5 s keeps the window short (runner serve's default is 30 s).
	fleetLeaseTTL = 5 * time.Second
	fleetKilled   = fleetPods / 10
)

// fleet: at N = 100 pods, pick-up p50/p99 (sequential samples, as
// pickup); end-to-end throughput of 100 pods of concurrency 1 against one
// Runner of concurrency 100 in the same repetition (coordination must not
// collapse it); and the takeover time when 10 pods holding runs die at
// once (their connections cut, nothing released): from the kill to the
// last of their runs started again by another pod. tasklease only: asynq
// recovers an active task of a dead server only after its 30 s lease and
// its recoverer's pass, and has no fencing to compare.
func (b *bench) fleet(rep int) error {
	pods := fleetPods
	if b.rep.quick {
		pods = fleetPods / 5 // a smoke test: the keys keep their names
	}
	lat, err := b.fleetPickup(pods)
	if err != nil {
		return fmt.Errorf("pick-up at %d pods: %w", fleetPods, err)
	}
	b.rep.add("pickup_p50_ms_100_pods", ms(percentile(lat, 50)))
	b.rep.add("pickup_p99_ms_100_pods", ms(percentile(lat, 99)))

	// Alternate which side goes first, as the limiter's ratio does.
	var one, many float64
	sides := []func() error{
		func() (err error) { one, err = b.fleetE2E(1, fleetE2EConcurrency); return },
		func() (err error) { many, err = b.fleetE2E(pods, fleetE2EConcurrency/pods); return },
	}
	if rep%2 == 1 {
		slices.Reverse(sides)
	}
	for _, s := range sides {
		if err := s(); err != nil {
			return fmt.Errorf("end to end: %w", err)
		}
	}
	b.rep.add("e2e_1stage_1_pod_per_s", one)
	b.rep.add("e2e_1stage_100_pods_per_s", many)
	b.rep.add("e2e_1stage_100_pods_ratio", many/one)

	takeover, err := b.fleetTakeover(pods, pods/10)
	if err != nil {
		return fmt.Errorf("takeover: %w", err)
	}
	b.rep.add("takeover_s_10_of_100_killed", takeover.Seconds())
	b.progress("fleet rep %d: %d pods pick-up p50 %.2f ms p99 %.2f ms (%d samples); end to end 1 pod of %d %.0f runs/s, %d pods of %d %.0f runs/s (%.2f); takeover after killing %d: %.2f s (lease TTL %s)",
		rep, pods, ms(percentile(lat, 50)), ms(percentile(lat, 99)), len(lat), fleetE2EConcurrency, one,
		pods, fleetE2EConcurrency/pods, many, many/one, pods/10, takeover.Seconds(), fleetLeaseTTL)
	return nil
}

// pod is one Runner with a client of its own, which can be killed: its
// connections cut and no new one dialled, as when its process dies (the
// Runner's separate wait client, made from the same options, dials
// through the same switch).
type pod struct {
	rdb    *redis.Client
	kill   *killSwitch
	cancel context.CancelFunc
	done   chan error
}

// startFleet starts n pods of the given concurrency running stages.
func (b *bench) startFleet(n, podConcurrency int, stages []jobs.Stage) ([]*pod, error) {
	pods := make([]*pod, 0, n)
	for i := range n {
		p, err := b.startPod(i, podConcurrency, stages)
		if err != nil {
			stopFleet(pods)
			return nil, err
		}
		pods = append(pods, p)
	}
	return pods, nil
}

func (b *bench) startPod(i, podConcurrency int, stages []jobs.Stage) (*pod, error) {
	ks := &killSwitch{}
	rdb := redis.NewClient(&redis.Options{Addr: b.addr, ClientName: podClientName, DisableIdentity: true,
		PoolFIFO: true, ConnMaxIdleTime: jobs.PoolIdleTimeout, Dialer: ks.dial, MaxRetries: -1})
	reg, err := jobs.NewRegistry(rdb, jobs.Config{Logger: discard, Jobs: []jobs.Job{{Scope: scope, Stages: stages}}})
	if err != nil {
		rdb.Close()
		return nil, err
	}
	rn, err := jobs.NewRunner(reg, jobs.RunnerConfig{ID: "pod-" + strconv.Itoa(i), Concurrency: podConcurrency,
		LeaseTTL: fleetLeaseTTL, ShutdownGrace: time.Second})
	if err != nil {
		rdb.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(b.ctx)
	p := &pod{rdb: rdb, kill: ks, cancel: cancel, done: make(chan error, 1)}
	go func() { p.done <- rn.Run(ctx) }()
	return p, nil
}

// stopFleet stops the pods together, as a fleet scaled to zero would.
func stopFleet(pods []*pod) {
	var wg sync.WaitGroup
	for _, p := range pods {
		wg.Go(func() {
			p.cancel()
			<-p.done
			p.rdb.Close()
		})
	}
	wg.Wait()
}

// killSwitch is a pod's dialer: after kill every connection it dialled is
// closed and no new one is made.
type killSwitch struct {
	mu    sync.Mutex
	dead  bool
	conns []net.Conn
}

var errPodKilled = errors.New("pod killed")

func (k *killSwitch) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.dead {
		return nil, errPodKilled
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err == nil {
		k.conns = append(k.conns, c)
	}
	return c, err
}

func (k *killSwitch) kill() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.dead = true
	for _, c := range k.conns {
		_ = c.Close()
	}
}

// fleetPickup samples pick-up latency with n idle pods.
func (b *bench) fleetPickup(n int) ([]time.Duration, error) {
	if err := b.reset(); err != nil {
		return nil, err
	}
	reg, err := jobs.NewRegistry(b.admin, jobs.Config{Logger: discard, Jobs: []jobs.Job{{Scope: scope, Stages: stageHandlers(1, nil)}}})
	if err != nil {
		return nil, err
	}
	ch := make(chan started, 16)
	pods, err := b.startFleet(n, fleetPodConcurrency, stageHandlers(1, func(_ context.Context, run *jobs.Run) {
		ch <- started{run.Subject(), time.Now()}
	}))
	if err != nil {
		return nil, err
	}
	defer stopFleet(pods)
	time.Sleep(idleSettle) // every pod has started and waits
	return sampleLatencies(b.ctx, b.sz.PickupSamples, 3*time.Millisecond, ch, func(id string) error {
		_, err := reg.Submit(b.ctx, id, scope, jobs.SubmitOptions{Source: jobs.SourceManual})
		return err
	})
}

// fleetE2E submits E2ERuns distinct no-op runs (50 submitters, as
// e2e_1stage) to n pods of podConcurrency each and returns runs/s until
// every handler ran and the queues are empty.
func (b *bench) fleetE2E(n, podConcurrency int) (float64, error) {
	if err := b.reset(); err != nil {
		return 0, err
	}
	runs := b.sz.E2ERuns
	var handled atomic.Int64
	pods, err := b.startFleet(n, podConcurrency, stageHandlers(1, func(context.Context, *jobs.Run) { handled.Add(1) }))
	if err != nil {
		return 0, err
	}
	defer stopFleet(pods)
	time.Sleep(idleSettle)
	sub := newClient(b.addr)
	defer sub.Close()
	reg, err := jobs.NewRegistry(sub, jobs.Config{Logger: discard, Jobs: []jobs.Job{{Scope: scope, Stages: stageHandlers(1, nil)}}})
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(b.ctx, e2eTimeout)
	defer cancel()
	snap0, err := takeSnapshot(ctx, b.admin)
	if err != nil {
		return 0, err
	}
	proc0 := processCPU()
	t0 := time.Now()
	err = parallel(ctx, runs, clients, func(i int) error {
		_, err := reg.Submit(ctx, "f"+strconv.Itoa(i), scope, jobs.SubmitOptions{Source: jobs.SourceManual})
		return err
	})
	if err != nil {
		return 0, err
	}
	if err := waitUntil(ctx, e2eTimeout, time.Millisecond, func() (bool, error) { return handled.Load() >= int64(runs), nil }); err != nil {
		return 0, fmt.Errorf("handlers ran %d of %d runs: %w", handled.Load(), runs, err)
	}
	if err := waitUntil(ctx, e2eTimeout, time.Millisecond, func() (bool, error) {
		stream, retry, err := reg.QueueDepth(ctx)
		return stream == 0 && retry == 0, err
	}); err != nil {
		return 0, fmt.Errorf("requests left in the queues: %w", err)
	}
	rate := float64(runs) / time.Since(t0).Seconds()
	if b.commands {
		snap, err := takeSnapshot(ctx, b.admin)
		if err != nil {
			return 0, err
		}
		b.progress("fleet end to end, %d pods of %d: per run Redis CPU %.1fµs, bench CPU %.1fµs: %s", n, podConcurrency,
			float64((snap.cpu-snap0.cpu).Microseconds())/float64(runs), float64((processCPU()-proc0).Microseconds())/float64(runs),
			formatCommands(commandDeltas(snap0.byCmd, snap.byCmd), runs))
	}
	b.check(fmt.Sprintf("fleet end to end, %d pods: handler calls", n), handled.Load(), int64(runs))
	return rate, nil
}

// fleetTakeover: n pods of concurrency 2 run n runs that hold their stage
// until the end; kill pods holding runs are killed at once, and the result
// is the time from the kill to the last of their runs entering its stage
// again on another pod.
func (b *bench) fleetTakeover(n, kill int) (time.Duration, error) {
	if err := b.reset(); err != nil {
		return 0, err
	}
	reg, err := jobs.NewRegistry(b.admin, jobs.Config{Logger: discard, Jobs: []jobs.Job{{Scope: scope, Stages: stageHandlers(1, nil)}}})
	if err != nil {
		return 0, err
	}
	release := make(chan struct{})
	type entry struct {
		subject, owner string
		at             time.Time
	}
	var mu sync.Mutex
	var entries []entry
	hold := jobs.HandlerFunc(func(ctx context.Context, run *jobs.Run) error {
		mu.Lock()
		entries = append(entries, entry{run.Subject(), run.Owner(), time.Now()})
		mu.Unlock()
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	})
	pods, err := b.startFleet(n, fleetPodConcurrency, []jobs.Stage{{Name: "pulling", Handler: hold}})
	if err != nil {
		return 0, err
	}
	defer stopFleet(pods)
	defer close(release)
	time.Sleep(idleSettle)
	runs := n
	for i := range runs {
		if _, err := reg.Submit(b.ctx, "t"+strconv.Itoa(i), scope, jobs.SubmitOptions{Source: jobs.SourceManual}); err != nil {
			return 0, err
		}
	}
	if err := waitUntil(b.ctx, time.Minute, time.Millisecond, func() (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		return len(entries) >= runs, nil
	}); err != nil {
		return 0, fmt.Errorf("runs started: %w", err)
	}
	// The victims: the first 10 pods (by index) that hold a run.
	mu.Lock()
	held := map[string][]string{} // owner prefix "pod-<i>/" → subjects
	for _, e := range entries {
		held[ownerPod(e.owner)] = append(held[ownerPod(e.owner)], e.subject)
	}
	mu.Unlock()
	var victims []string // their subjects
	killed := 0
	t0 := time.Now()
	for i, p := range pods {
		subs := held["pod-"+strconv.Itoa(i)]
		if len(subs) == 0 {
			continue
		}
		p.kill.kill()
		victims = append(victims, subs...)
		if killed++; killed == kill {
			break
		}
	}
	again := func() (time.Duration, bool) {
		mu.Lock()
		defer mu.Unlock()
		var last time.Time
		for _, s := range victims {
			found := false
			for _, e := range entries {
				if e.subject == s && e.at.After(t0) {
					found, last = true, maxTime(last, e.at)
					break
				}
			}
			if !found {
				return 0, false
			}
		}
		return last.Sub(t0), true
	}
	var took time.Duration
	if err := waitUntil(b.ctx, 6*fleetLeaseTTL, time.Millisecond, func() (bool, error) {
		d, ok := again()
		took = d
		return ok, nil
	}); err != nil {
		return 0, fmt.Errorf("the %d runs of the %d pods killed started again: %w", len(victims), killed, err)
	}
	return took, nil
}

// ownerPod is the pod part of a lease owner "pod-<i>/<instance>".
func ownerPod(owner string) string {
	for i := range len(owner) {
		if owner[i] == '/' {
			return owner[:i]
		}
	}
	return owner
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
