package jobs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/keyspace"
	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/taskkey"
)

// Bounded state (issue 4/8, defect 9; DESIGN §2.6): everything tasklease
// writes is bounded by live work or expires with the retention.

// TestJanitorPrunesSubjectsIndexAndConsumers drives miniredis time past
// the retention and checks each kind of bookkeeping is pruned — and that
// what is still live is kept.
func TestJanitorPrunesSubjectsIndexAndConsumers(t *testing.T) {
	mini := redistest.StartMini(t)
	rdb := mini.Client(t)
	ctx := context.Background()
	const retention = time.Hour
	c := &counter{}
	g := newGate()
	e := newEnv(t, rdb, Config{Prefix: "jn", Partitions: 1, Retention: retention, Jobs: []Job{
		clJob("course_sync", Stage{Name: "pulling", Handler: c}),
		clJob("backup", Stage{Name: "pulling", Handler: g}),
	}})
	// Finished work, and one long-lived active run.
	for i := range 5 {
		clSubmit(t, e.reg, fmt.Sprintf("old%d", i), "course_sync", SourceManual, "")
	}
	clSubmit(t, e.reg, "sched", "course_sync", SourceSchedule, "") // never a subject of "all"
	clSubmit(t, e.reg, "busy", "backup", SourceManual, "")
	_, stop := e.startRunner(RunnerConfig{ID: "jn-old", JanitorInterval: time.Hour})
	for i := range 5 {
		e.waitStatus(fmt.Sprintf("old%d", i), "course_sync", 10*time.Second, StatusDone)
	}
	e.waitStatus("sched", "course_sync", 10*time.Second, StatusDone)
	waitFor(t, 10*time.Second, "the long run to start", func() bool { return g.count() == 1 })
	if subs, _ := e.reg.Subjects(ctx, "course_sync"); !slices.Equal(subs, []string{"old0", "old1", "old2", "old3", "old4"}) {
		t.Fatalf("subjects %v, want old0..old4 (schedule requests add none)", subs)
	}
	g.open()
	e.waitStatus("busy", "backup", 10*time.Second, StatusDone)
	stop()
	// An active run older than the retention keeps its record and index
	// entry (its subject, not requested since, leaves "all").
	clSubmit(t, e.reg, "pending", "course_sync", SourceManual, "")
	takeEntries(t, e.reg, 0, 10) // a runner holds its entry

	mini.Advance(retention + time.Minute) // the finished records expire
	clSubmit(t, e.reg, "fresh", "course_sync", SourceForeground, "")

	rn, err := NewRunner(e.reg, RunnerConfig{ID: "jn-new"})
	if err != nil {
		t.Fatal(err)
	}
	rn.janitorPass(ctx)

	if subs, _ := e.reg.Subjects(ctx, "course_sync"); !slices.Equal(subs, []string{"fresh"}) {
		t.Errorf("subjects after the retention %v, want [fresh]", subs)
	}
	if subs, _ := e.reg.Subjects(ctx, "backup"); len(subs) != 0 {
		t.Errorf("backup subjects after the retention %v, want none", subs)
	}
	idx, _ := rdb.ZRange(ctx, e.reg.ks.Index(0), 0, -1).Result()
	slices.Sort(idx)
	if want := []string{"fresh|course_sync", "pending|course_sync"}; !slices.Equal(idx, want) {
		t.Errorf("index after the retention %v, want %v", idx, want)
	}
	// Every key left is live work or has an expiry.
	keys, _ := rdb.Keys(ctx, "*").Result()
	for _, k := range keys {
		if d, _ := rdb.PTTL(ctx, k).Result(); d < 0 && !bndLive(e, k) {
			t.Errorf("key %s has no expiry and is not live work", k)
		}
	}
}

// bndLive reports whether key k is bookkeeping of live work (the partition's
// taken set, index, subjects of live subjects, watch keys, the due index) or
// of an active run.
func bndLive(e *testEnv, k string) bool {
	ks := e.reg.ks
	switch k {
	case ks.Queue(0, keyspace.LanePeople), ks.Queue(0, keyspace.LaneBulk), ks.Taken(0), ks.Bell(0), ks.Index(0), ks.Subjects(0, "course_sync"), ks.Retry(0), ks.Due():
		return true
	}
	for _, s := range []string{"fresh", "pending"} {
		key := taskkey.MustNew(s, "course_sync")
		if k == ks.Task(key) || k == ks.History(key) {
			return true
		}
	}
	return false
}

// TestFenceCounterExpiresWithTheRecord: a key's fencing counter is its run
// record's token, so it expires with the record (the retention after the
// run ended) and no separate counter key is kept; yet the next grant's token
// is still higher than every earlier one.
func TestFenceCounterExpiresWithTheRecord(t *testing.T) {
	mini := redistest.StartMini(t)
	rdb := mini.Client(t)
	ctx := context.Background()
	c := &counter{}
	e := newEnv(t, rdb, Config{Prefix: "fc", Retention: time.Hour, Jobs: []Job{clJob("course_sync", Stage{Name: "pulling", Handler: c})}})
	e.startRunner(RunnerConfig{ID: "fc"})
	clSubmit(t, e.reg, "u1", "course_sync", SourceManual, "")
	v1 := e.waitStatus("u1", "course_sync", 10*time.Second, StatusDone)
	k := taskkey.MustNew("u1", "course_sync")
	if d, _ := rdb.PTTL(ctx, e.reg.ks.Task(k)).Result(); d <= 0 || d > time.Hour {
		t.Fatalf("record PTTL %v, want the retention", d)
	}
	if tok, _ := rdb.HGet(ctx, e.reg.ks.Task(k), "token").Result(); tok != strconv.FormatInt(v1.FencingToken, 10) {
		t.Fatalf("record token %q, want the grant's %d", tok, v1.FencingToken)
	}
	if n, _ := rdb.Exists(ctx, e.reg.ks.Fence(k)).Result(); n != 0 {
		t.Fatalf("a separate fence counter key exists")
	}
	mini.Advance(2 * time.Hour)
	for _, key := range []string{e.reg.ks.Fence(k), e.reg.ks.Task(k), e.reg.ks.History(k)} {
		if n, _ := rdb.Exists(ctx, key).Result(); n != 0 {
			t.Errorf("%s still exists after the retention", key)
		}
	}
	clSubmit(t, e.reg, "u1", "course_sync", SourceManual, "")
	v2 := e.waitStatus("u1", "course_sync", 10*time.Second, StatusDone)
	if v2.FencingToken <= v1.FencingToken {
		t.Errorf("token after the counter expired %d, want above %d", v2.FencingToken, v1.FencingToken)
	}
}

// TestSubscribersShareOnePubSubConnection: many Subscribe calls (one per
// SSE client) share one Redis subscription, and every one of them gets
// every view.
func TestSubscribersShareOnePubSubConnection(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			e := newEnv(t, b.Client, Config{Prefix: "ps", Partitions: 2, Jobs: []Job{clJob("course_sync", Stage{Name: "pulling", Handler: &counter{}})}})
			const n = 50
			subs := make([]<-chan TaskView, n)
			for i := range subs {
				ch, err := e.reg.Subscribe(ctx)
				if err != nil {
					t.Fatal(err)
				}
				subs[i] = ch
			}
			counts, err := b.Client.PubSubNumSub(ctx, e.reg.ks.Events(0), e.reg.ks.Events(1)).Result()
			if err != nil {
				t.Fatal(err)
			}
			for ch, c := range counts {
				if c != 1 {
					t.Errorf("%s has %d Redis subscribers for %d Subscribe calls, want 1", ch, c, n)
				}
			}
			clSubmit(t, e.reg, "u1", "course_sync", SourceManual, "")
			for i, ch := range subs {
				v := clRecv(t, ch, 5*time.Second, fmt.Sprintf("subscriber %d's view", i))
				if v.Key != "u1|course_sync" || v.Status != StatusQueued {
					t.Errorf("subscriber %d got %s %s, want u1|course_sync queued", i, v.Key, v.Status)
				}
			}
			cancel()
			// The last subscriber gone, the shared connection closes.
			waitFor(t, 5*time.Second, "the subscription to close", func() bool {
				counts, err := b.Client.PubSubNumSub(context.Background(), e.reg.ks.Events(0)).Result()
				return err == nil && counts[e.reg.ks.Events(0)] == 0
			})
		})
	}
}

// TestFinishedEntriesLeaveTheQueueRunningOnesStay: finishing a run
// removes its request entry from the partition's queue and nothing a run
// still needs: the entry of a run in progress stays taken however many
// newer runs end around it, and once nothing runs the queue is empty.
func TestFinishedEntriesLeaveTheQueueRunningOnesStay(t *testing.T) {
	rdb := redistest.StartServer(t).Client(t)
	ctx := context.Background()
	const scope, before, after = "course_sync", 150, 150
	release := make(chan struct{})
	stage := HandlerFunc(func(ctx context.Context, run *Run) error {
		if run.Subject() == "held" {
			select {
			case <-release:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})
	e := newEnv(t, rdb, Config{Prefix: "tr", Partitions: 1, Jobs: []Job{clJob(scope, Stage{Name: "pulling", Handler: stage})}})
	e.startRunner(RunnerConfig{ID: "tr", Concurrency: 8})
	submitAll := func(from, n int) {
		for i := from; i < from+n; i++ {
			clSubmit(t, e.reg, fmt.Sprintf("u%d", i), scope, SourceSchedule, "")
		}
		for i := from; i < from+n; i++ {
			e.waitStatus(fmt.Sprintf("u%d", i), scope, 20*time.Second, StatusDone)
		}
	}
	submitAll(0, before)
	clSubmit(t, e.reg, "held", scope, SourceSchedule, "")
	e.waitStatus("held", scope, 10*time.Second, StatusRunning)
	heldEntry := clRaw(t, e.reg, "held", scope)["entry"]
	submitAll(before, after)

	taken, err := rdb.ZRange(ctx, e.reg.ks.Taken(0), 0, -1).Result()
	if err != nil || len(taken) != 1 || taken[0] != heldEntry {
		t.Fatalf("taken entries %q, %v; want only the running run's %q", taken, err, heldEntry)
	}
	if lines, _ := queueState(ctx, rdb, e.reg, 0); len(lines) != 1 {
		t.Errorf("queue after %d runs ended around the running one: %v; want only its taken entry", before+after, lines)
	}
	close(release)
	e.waitStatus("held", scope, 10*time.Second, StatusDone)
	waitFor(t, 10*time.Second, "an empty queue once nothing runs", func() bool {
		_, empty := queueState(ctx, rdb, e.reg, 0)
		return empty
	})
}

// TestJanitorOnePassAFleet: the janitor's pass is the fleet's: a runner
// that finds another's turn within the interval prunes nothing, and takes
// the turn once it has expired.
func TestJanitorOnePassAFleet(t *testing.T) {
	mini := redistest.StartMini(t)
	rdb := mini.Client(t)
	ctx := context.Background()
	e := newEnv(t, rdb, Config{Prefix: "jf", Partitions: 1, Retention: time.Hour, Jobs: []Job{
		clJob("course_sync", Stage{Name: "pulling", Handler: &counter{}}),
	}})
	var rns []*Runner
	for _, id := range []string{"jf-a", "jf-b"} {
		rn, err := NewRunner(e.reg, RunnerConfig{ID: id, JanitorInterval: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		rns = append(rns, rn)
	}
	// index entries of records long gone: what a pass removes
	stale := func(subject string) string {
		m := subject + "|course_sync"
		if err := rdb.ZAdd(ctx, e.reg.ks.Index(0), redis.Z{Score: 1, Member: m}).Err(); err != nil {
			t.Fatal(err)
		}
		return m
	}
	indexed := func(m string) bool {
		t.Helper()
		_, err := rdb.ZScore(ctx, e.reg.ks.Index(0), m).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
		return err == nil
	}
	first := stale("gone1")
	rns[0].janitorPass(ctx)
	if indexed(first) {
		t.Fatal("the first runner's pass kept an index entry of a record long gone")
	}
	second := stale("gone2")
	rns[1].janitorPass(ctx)
	if !indexed(second) {
		t.Fatal("a second runner pruned within the first's janitor interval: one pass a runner, not a fleet")
	}
	mini.Advance(time.Minute)
	rns[1].janitorPass(ctx)
	if indexed(second) {
		t.Fatal("after the interval the second runner did not take the janitor's turn")
	}
}
