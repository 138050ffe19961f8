package triggers

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/keyspace"
	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/internal/seeding"
	"github.com/tasklease/tasklease/jobs"
	"github.com/tasklease/tasklease/taskkey"
)

// TestFanOutMillion measures one "subjects: all" occurrence over a million
// subjects on a real redis-server of its own:
//
//	TASKLEASE_FANOUT_1M=1 go test -run TestFanOutMillion -count=1 -timeout 30m -v ./triggers/
//
// (TASKLEASE_FANOUT_N overrides the count for a quick dry run;
// TASKLEASE_FANOUT_OUT=FILE also writes the figures as JSON.)
//
// Seeding: the subjects are ZADDed straight into the partitions' subject
// sets (keys computed with internal/keyspace exactly as the Registry
// does), pipelined — the state of subjects that people asked for within
// the retention but whose records have since finished and expired. So the
// fan-out takes the heaviest path for every subject: a new run (record,
// request stream entry, history, index). It measures wall time, the
// process's peak Go heap and peak RSS during the fan-out, and Redis memory,
// and checks that every subject got exactly one request: its record
// remembers the occurrence and its history holds exactly one event, and
// the bulk lanes hold exactly one entry per subject.
func TestFanOutMillion(t *testing.T) {
	if os.Getenv("TASKLEASE_FANOUT_1M") != "1" {
		t.Skip("the million-subject measurement runs with TASKLEASE_FANOUT_1M=1")
	}
	n := 1_000_000
	if v := os.Getenv("TASKLEASE_FANOUT_N"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n <= 0 {
			t.Fatalf("TASKLEASE_FANOUT_N=%q", v)
		}
	}
	const (
		partitions = 16 // the default
		scope      = "course_sync"
		name       = "million"
	)
	srv := redistest.StartServer(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	stages := []jobs.Stage{{Name: "pulling", Handler: noop}, {Name: "pushing", Handler: noop}}
	reg, err := jobs.NewRegistry(rdb, jobs.Config{Prefix: testPrefix, Partitions: partitions, Logger: testLogger(),
		Jobs: []jobs.Job{{Scope: scope, Stages: stages, Foreground: true}}})
	if err != nil {
		t.Fatal(err)
	}
	ks, err := keyspace.New(testPrefix, partitions)
	if err != nil {
		t.Fatal(err)
	}
	subject := func(i int) string { return fmt.Sprintf("user%07d", i) }

	seedStart := time.Now()
	if err := seeding.Subjects(ctx, rdb, ks, scope, n, subject); err != nil {
		t.Fatal(err)
	}
	t.Logf("seeded %d subjects in %s", n, time.Since(seedStart).Round(time.Millisecond))

	s := newScheduler(t, rdb, reg, SchedulerConfig{ID: "million",
		Schedules: []Schedule{{Name: name, Cron: "@hourly", Scope: scope, AllSubjects: true}}})
	var d decisions
	s.forceLeader, s.observe = true, d.add
	occ := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

	// Memory during the fan-out only: collect, return memory to the OS and
	// reset the RSS high-water mark (clear_refs 5) before it starts.
	runtime.GC()
	debug.FreeOSMemory()
	hwmReset := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0) == nil
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	baseHeap, baseRSS := ms.HeapAlloc, procStatusKB("VmRSS")
	var peakHeap, peakRSS uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			peakHeap = max(peakHeap, m.HeapAlloc)
			peakRSS = max(peakRSS, procStatusKB("VmRSS"))
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	})
	start := time.Now()
	dec := s.fire(ctx, s.entries[0], occ)
	elapsed := time.Since(start)
	close(stop)
	wg.Wait()
	hwm := procStatusKB("VmHWM")
	if !hwmReset {
		hwm = 0 // the mark covers the seeding too: not a fan-out figure
	}

	info := redisInfo(t, rdb)
	k0 := taskkey.MustNew(subject(0), scope)
	p0 := ks.Partition(k0)
	usage := func(key string) int64 { return rdb.MemoryUsage(ctx, key).Val() }
	f := d.all[len(d.all)-1]
	res := map[string]any{
		"subjects": n, "partitions": partitions, "batch": FanOutBatch, "decision": dec,
		"seconds": elapsed.Seconds(), "subjects_per_second": float64(n) / elapsed.Seconds(),
		"submitted": f.submitted, "duplicates": f.duplicates, "batches": f.batches, "max_batch": f.maxBatch,
		"go_heap_before_mib": mib(baseHeap), "go_heap_peak_mib": mib(peakHeap),
		"rss_before_mib": float64(baseRSS) / 1024, "rss_peak_mib": float64(peakRSS) / 1024, "vm_hwm_mib": float64(hwm) / 1024,
		"redis_used_memory": info["used_memory_human"], "redis_used_memory_peak": info["used_memory_peak_human"],
		"redis_bytes_task_record": usage(ks.Task(k0)), "redis_bytes_history": usage(ks.History(k0)),
		"redis_bytes_request_queue_per_subject": usage(ks.Queue(p0, keyspace.LaneBulk)) / max(1, rdb.LLen(ctx, ks.Queue(p0, keyspace.LaneBulk)).Val()),
		"redis_bytes_index_per_subject":         usage(ks.Index(p0)) / max(1, rdb.ZCard(ctx, ks.Index(p0)).Val()),
		"redis_bytes_subject_set_per_subject":   usage(ks.Subjects(p0, scope)) / max(1, rdb.ZCard(ctx, ks.Subjects(p0, scope)).Val()),
		"redis_version":                         info["redis_version"], "go": runtime.Version(), "gomaxprocs": runtime.GOMAXPROCS(0),
	}
	js, _ := json.MarshalIndent(res, "", "  ")
	t.Logf("fan-out figures:\n%s", js)
	if out := os.Getenv("TASKLEASE_FANOUT_OUT"); out != "" {
		if err := os.WriteFile(out, js, 0o644); err != nil {
			t.Error(err)
		}
	}
	if dec != DecisionFired || f.submitted != n || f.duplicates != 0 {
		t.Fatalf("decision %s, submitted %d, duplicates %d; want fired, %d, 0", dec, f.submitted, f.duplicates, n)
	}

	// Exactly one request per subject, checked in Redis.
	checkStart := time.Now()
	var entries int64
	for p := range partitions {
		entries += rdb.LLen(ctx, ks.Queue(p, keyspace.LaneBulk)).Val()
	}
	if entries != int64(n) {
		t.Errorf("bulk lanes hold %d entries; want %d (one new run per subject)", entries, n)
	}
	want := strconv.FormatInt(occ.Unix(), 10)
	bad := 0
	for i := 0; i < n; i += 10_000 {
		pipe := rdb.Pipeline()
		type pair struct {
			occ  *redis.StringCmd
			hist *redis.IntCmd
		}
		cmds := make([]pair, 0, 10_000)
		for j := i; j < min(i+10_000, n); j++ {
			k := taskkey.MustNew(subject(j), scope)
			cmds = append(cmds, pair{pipe.HGet(ctx, ks.Task(k), "occ:"+name), pipe.LLen(ctx, ks.History(k))})
		}
		if _, err := pipe.Exec(ctx); err != nil && err != redis.Nil {
			t.Fatal(err)
		}
		for j, c := range cmds {
			if c.occ.Val() != want || c.hist.Val() != 1 {
				if bad++; bad <= 10 {
					t.Errorf("%s: occ:%s = %q, %d history events; want %s and 1", subject(i+j), name, c.occ.Val(), c.hist.Val(), want)
				}
			}
		}
	}
	if bad > 0 {
		t.Errorf("%d of %d subjects did not get exactly one request", bad, n)
	}
	t.Logf("checked %d subjects in %s", n, time.Since(checkStart).Round(time.Millisecond))
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// procStatusKB returns a "kB" field of /proc/self/status (0 if unknown).
func procStatusKB(field string) uint64 {
	fh, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && k == field {
			n, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

// redisInfo returns INFO server+memory as key/value pairs.
func redisInfo(t testing.TB, rdb redis.UniversalClient) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, section := range []string{"server", "memory"} {
		txt, err := rdb.Info(context.Background(), section).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(txt, "\r\n") {
			if k, v, ok := strings.Cut(line, ":"); ok {
				out[k] = v
			}
		}
	}
	return out
}
