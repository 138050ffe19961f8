package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/keyspace"
	"github.com/tasklease/tasklease/internal/seeding"
	"github.com/tasklease/tasklease/jobs"
	"github.com/tasklease/tasklease/triggers"
)

// fanoutChildFlag, as the first argument, makes this binary the cron
// leader of the fanout measurement (hidden from --help).
const fanoutChildFlag = "--fanout-child"

const fanoutSchedule = "fanout"

// fanoutReport is what the child prints (one JSON line).
type fanoutReport struct {
	Seconds     float64 `json:"seconds"`      // the fan-out, by its Redis timestamps (startedAt → finishedAt)
	WallSeconds float64 `json:"wall_seconds"` // Scheduler.Run → the fan-out seen done
	Submitted   int64   `json:"submitted"`
	Duplicates  int64   `json:"duplicates"`
	Batches     int64   `json:"batches"`
	Resumes     int64   `json:"resumes"`
	VmHWMKB     int64   `json:"vm_hwm_kb"` // the child's peak RSS
}

// fanout: one "subjects: all" occurrence over N subjects, fired by a
// triggers.Scheduler in a child process whose peak RSS is the leader's.
//
// Seeding puts the subjects straight into the partitions' subject sets
// (key names from internal/keyspace, as the Registry computes them): the
// state of subjects people asked for within the retention whose runs have
// since finished and expired, so every subject takes the heaviest path, a
// new run.
func (b *bench) fanout(rep int) error {
	n := b.sz.FanoutSubjects
	if err := b.reset(); err != nil {
		return err
	}
	ks, err := keyspace.New("", 0) // the Registry's defaults
	if err != nil {
		return err
	}
	if err := seedSubjects(b.ctx, b.admin, ks, n); err != nil {
		return fmt.Errorf("seed: %w", err)
	}

	cmd := exec.CommandContext(b.ctx, os.Args[0], fanoutChildFlag, "--addr", b.addr, "--n", strconv.Itoa(n))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("leader process: %w\n%s", err, stderr.String())
	}
	var res fanoutReport
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		return fmt.Errorf("leader process printed %q: %w", stdout.String(), err)
	}

	// Exactly one request per subject, in Redis: one queued request and one
	// indexed run record per subject (nothing consumes them).
	reg, err := jobs.NewRegistry(b.admin, jobs.Config{Logger: discard, Jobs: []jobs.Job{{Scope: scope, Stages: stageHandlers(2, nil)}}})
	if err != nil {
		return err
	}
	entries, _, err := reg.QueueDepth(b.ctx)
	if err != nil {
		return err
	}
	var records int64
	pipe := b.admin.Pipeline()
	cards := make([]*redis.IntCmd, ks.Partitions())
	for p := range cards {
		cards[p] = pipe.ZCard(b.ctx, ks.Index(p))
	}
	if _, err := pipe.Exec(b.ctx); err != nil {
		return err
	}
	for _, c := range cards {
		records += c.Val()
	}
	b.check(fmt.Sprintf("fanout rep %d: requests submitted by the leader", rep), res.Submitted, int64(n))
	b.check(fmt.Sprintf("fanout rep %d: duplicates", rep), res.Duplicates, 0)
	b.check(fmt.Sprintf("fanout rep %d: requests queued", rep), entries, int64(n))
	b.check(fmt.Sprintf("fanout rep %d: run records", rep), records, int64(n))

	rss := float64(res.VmHWMKB) / 1024
	b.rep.add("fanout_s", res.Seconds)
	b.rep.add("fanout_1m_s", res.Seconds*1e6/float64(n))
	b.rep.add("fanout_wall_s", res.WallSeconds)
	b.rep.add("fanout_leader_rss_mb", rss)
	b.progress("fanout rep %d: %d subjects in %.2f s (%.0f/s, %d batches), leader peak RSS %.1f MB",
		rep, n, res.Seconds, float64(n)/res.Seconds, res.Batches, rss)
	return b.reset() // a million records: give the memory back at once
}

// seedSubjects adds subjects f0000000… to the subject sets of scope.
func seedSubjects(ctx context.Context, rdb redis.UniversalClient, ks *keyspace.Space, n int) error {
	return seeding.Subjects(ctx, rdb, ks, scope, n, fanoutSubject)
}

func fanoutSubject(i int) string { return fmt.Sprintf("f%07d", i) }

// fanoutChild is the leader process: a Registry and a Scheduler with one
// "subjects: all" schedule whose only recent occurrence was a minute ago,
// so the new leader fires it at once (catch-up) and no other occurrence
// is due for a year. It prints a fanoutReport once the fan-out is done.
func fanoutChild(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("fanout-child", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "", "redis address")
	n := fs.Int("n", 0, "subjects (for the timeout)")
	if err := fs.Parse(args); err != nil || *addr == "" {
		return 2
	}
	res, err := leadFanout(*addr, *n)
	if err != nil {
		fmt.Fprintln(stderr, "fanout leader:", err)
		return 1
	}
	if err := json.NewEncoder(stdout).Encode(res); err != nil {
		return 1
	}
	return 0
}

func leadFanout(addr string, n int) (fanoutReport, error) {
	var res fanoutReport
	rdb := newClient(addr)
	defer rdb.Close()
	reg, err := jobs.NewRegistry(rdb, jobs.Config{Logger: discard,
		Jobs: []jobs.Job{{Scope: scope, Stages: stageHandlers(2, nil)}}})
	if err != nil {
		return res, err
	}
	occ := time.Now().UTC().Truncate(time.Minute).Add(-time.Minute)
	spec := fmt.Sprintf("%d %d %d %d *", occ.Minute(), occ.Hour(), occ.Day(), int(occ.Month()))
	sched, err := triggers.NewScheduler(rdb, reg, triggers.SchedulerConfig{
		ID: "bench-leader", Logger: discard,
		// Catch-up looks back LeaderTTL + LeaderTTL/3: past the occurrence.
		LeaderTTL: 10 * time.Minute,
		Schedules: []triggers.Schedule{{Name: fanoutSchedule, Cron: spec, Scope: scope, AllSubjects: true}},
	})
	if err != nil {
		return res, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- sched.Run(ctx) }()

	timeout := 5*time.Minute + time.Duration(n)*500*time.Microsecond
	var st *triggers.FanOutStatus
	err = waitUntil(ctx, timeout, 10*time.Millisecond, func() (bool, error) {
		all, err := sched.Status(ctx)
		if err != nil || len(all) != 1 {
			return false, err
		}
		st = all[0].LastOccurrence
		return st != nil && st.Done, nil
	})
	res.WallSeconds = time.Since(start).Seconds()
	cancel()
	if e := <-done; e != nil && err == nil {
		err = e
	}
	if err != nil {
		return res, fmt.Errorf("fan-out not done: %w (status %+v)", err, st)
	}
	if !st.Occurrence.Equal(occ) || st.Abandoned || st.FinishedAt == nil {
		return res, fmt.Errorf("unexpected fan-out %+v, want occurrence %s finished", st, occ)
	}
	res.Seconds = st.FinishedAt.Sub(st.StartedAt).Seconds()
	res.Submitted, res.Duplicates, res.Batches, res.Resumes = st.Submitted, st.Duplicates, st.Batches, st.Resumes
	res.VmHWMKB = procStatusKB("VmHWM")
	return res, nil
}

// procStatusKB returns a "kB" field of /proc/self/status (0 if unknown).
func procStatusKB(field string) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && k == field {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return n
		}
	}
	return 0
}
