package checkpoints_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/checkpoints"
	"github.com/tasklease/tasklease/internal/keyspace"
	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/leasing"
	"github.com/tasklease/tasklease/taskkey"
)

var stages3 = []string{"pulling", "merging", "pushing"}

type fixture struct {
	b     redistest.Backend
	m     *leasing.Manager
	store *checkpoints.Store
	ks    *keyspace.Space
}

func newFixture(t *testing.T, b redistest.Backend) *fixture {
	t.Helper()
	m, err := leasing.NewManager(b.Client, leasing.Config{})
	if err != nil {
		t.Fatal(err)
	}
	store, err := checkpoints.NewStore(b.Client, checkpoints.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ks, err := keyspace.New("", 0)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{b: b, m: m, store: store, ks: ks}
}

// key returns a task key unique to the running (sub)test.
func key(t *testing.T, scope string) taskkey.Key {
	t.Helper()
	subject := strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '.'
	}, t.Name())
	return taskkey.MustNew(subject, scope)
}

func (f *fixture) acquire(t *testing.T, k taskkey.Key, owner string, ttl time.Duration) leasing.Lease {
	t.Helper()
	l, err := f.m.Acquire(context.Background(), k, owner, ttl)
	if err != nil {
		t.Fatalf("Acquire %s by %s: %v", k, owner, err)
	}
	return l
}

func (f *fixture) load(t *testing.T, k taskkey.Key) *checkpoints.Checkpoint {
	t.Helper()
	cp, err := f.store.Load(context.Background(), k)
	if err != nil {
		t.Fatalf("Load %s: %v", k, err)
	}
	return cp
}

func TestDecide(t *testing.T) {
	st := []string{"pulling", "pushing"}
	tests := []struct {
		name string
		cp   *checkpoints.Checkpoint
		want checkpoints.Recovery
	}{
		{"no checkpoint", nil, checkpoints.Recovery{Mode: checkpoints.Restart}},
		{"nothing done", &checkpoints.Checkpoint{Stages: st}, checkpoints.Recovery{Mode: checkpoints.Restart, Stage: "pulling"}},
		{"nothing done, no stages", &checkpoints.Checkpoint{}, checkpoints.Recovery{Mode: checkpoints.Restart}},
		{"empty cursor", &checkpoints.Checkpoint{Stages: st, Cursor: []byte{}}, checkpoints.Recovery{Mode: checkpoints.Restart, Stage: "pulling"}},
		{"progress in first stage", &checkpoints.Checkpoint{Stages: st, Stage: "pulling", Cursor: []byte{0}},
			checkpoints.Recovery{Mode: checkpoints.Resume, StageIndex: 0, Stage: "pulling", Cursor: []byte{0}}},
		{"first stage done", &checkpoints.Checkpoint{Stages: st, Completed: 1, Stage: "pushing"},
			checkpoints.Recovery{Mode: checkpoints.Resume, StageIndex: 1, Stage: "pushing"}},
		{"first stage done, cursor", &checkpoints.Checkpoint{Stages: st, Completed: 1, Stage: "pushing", Cursor: []byte("p=3")},
			checkpoints.Recovery{Mode: checkpoints.Resume, StageIndex: 1, Stage: "pushing", Cursor: []byte("p=3")}},
		{"all done", &checkpoints.Checkpoint{Stages: st, Completed: 2}, checkpoints.Recovery{Mode: checkpoints.Skip, StageIndex: 2}},
		{"all done, stale cursor", &checkpoints.Checkpoint{Stages: st, Completed: 2, Cursor: []byte("x")}, checkpoints.Recovery{Mode: checkpoints.Skip, StageIndex: 2}},
		{"more done than stages", &checkpoints.Checkpoint{Stages: st, Completed: 5}, checkpoints.Recovery{Mode: checkpoints.Skip, StageIndex: 2}},
	}
	for _, tt := range tests {
		if got := checkpoints.Decide(tt.cp); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: Decide = %+v, want %+v", tt.name, got, tt.want)
		}
	}
}

func TestCompletedStages(t *testing.T) {
	cp := &checkpoints.Checkpoint{Stages: stages3, Completed: 2}
	if got := cp.CompletedStages(); !reflect.DeepEqual(got, []string{"pulling", "merging"}) {
		t.Fatalf("CompletedStages = %v", got)
	}
	cp.Completed = 9
	if got := cp.CompletedStages(); len(got) != 3 {
		t.Fatalf("CompletedStages with Completed > len = %v", got)
	}
	cp.Completed = 0
	if got := cp.CompletedStages(); len(got) != 0 {
		t.Fatalf("CompletedStages with none done = %v", got)
	}
}

func TestValidateStages(t *testing.T) {
	many := make([]string, 65)
	for i := range many {
		many[i] = fmt.Sprintf("s%d", i)
	}
	tests := []struct {
		stages []string
		ok     bool
	}{
		{[]string{"pulling"}, true},
		{[]string{"pulling", "pushing", "a-b_c9"}, true},
		{many[:64], true},
		{many, false},
		{nil, false},
		{[]string{}, false},
		{[]string{""}, false},
		{[]string{"Pulling"}, false},
		{[]string{"1pull"}, false},
		{[]string{"-pull"}, false},
		{[]string{"pull,push"}, false},
		{[]string{"pull ing"}, false},
		{[]string{"a" + strings.Repeat("b", 63)}, true},
		{[]string{"a" + strings.Repeat("b", 64)}, false},
		{[]string{"pulling", "pulling"}, false},
	}
	for _, tt := range tests {
		err := checkpoints.ValidateStages(tt.stages)
		if tt.ok != (err == nil) {
			t.Errorf("ValidateStages(%q) = %v, want ok=%v", tt.stages, err, tt.ok)
		}
		if err != nil && !errors.Is(err, checkpoints.ErrConfig) {
			t.Errorf("ValidateStages(%q) = %v, want ErrConfig", tt.stages, err)
		}
	}
}

func TestNewStoreConfig(t *testing.T) {
	if _, err := checkpoints.NewStore(nil, checkpoints.Config{}); !errors.Is(err, checkpoints.ErrConfig) {
		t.Errorf("NewStore(nil) = %v, want ErrConfig", err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	defer rdb.Close()
	for _, cfg := range []checkpoints.Config{
		{Prefix: "bad prefix"},
		{Partitions: -2},
		{HistoryCap: -1},
	} {
		if _, err := checkpoints.NewStore(rdb, cfg); !errors.Is(err, checkpoints.ErrConfig) {
			t.Errorf("NewStore(%+v) = %v, want ErrConfig", cfg, err)
		}
	}
	if _, err := checkpoints.NewStore(rdb, checkpoints.Config{Prefix: "app", Partitions: 3, HistoryCap: 10}); err != nil {
		t.Errorf("NewStore(valid) = %v", err)
	}
}

func TestMillisTime(t *testing.T) {
	if got := checkpoints.MillisTime("1767225600123"); !got.Equal(time.Date(2026, 1, 1, 0, 0, 0, 123e6, time.UTC)) || got.Location() != time.UTC {
		t.Fatalf("MillisTime = %v", got)
	}
	for _, s := range []string{"", "0", "x"} {
		if got := checkpoints.MillisTime(s); !got.IsZero() {
			t.Errorf("MillisTime(%q) = %v, want zero", s, got)
		}
	}
}

// TestLifecycle: Begin creates the record (restart), Advance walks the
// stages, SaveProgress and Load keep a binary cursor exactly, and Decide
// gives resume then skip.
func TestLifecycle(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			f := newFixture(t, b)
			k := key(t, "course_sync")

			if _, err := f.store.Load(ctx, k); !errors.Is(err, checkpoints.ErrNotFound) {
				t.Fatalf("Load before Begin = %v, want ErrNotFound", err)
			}
			lease := f.acquire(t, k, "pod-a", 10*time.Second)
			redisNow, err := b.Client.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			cp, err := f.store.Begin(ctx, lease, "run-1", stages3)
			if err != nil {
				t.Fatalf("Begin: %v", err)
			}
			if cp.RunID != "run-1" || !reflect.DeepEqual(cp.Stages, stages3) || cp.Completed != 0 ||
				cp.Stage != "pulling" || cp.Cursor != nil || cp.Attempt != 1 || cp.Owner != "pod-a" || cp.Token != lease.Token {
				t.Fatalf("Begin checkpoint = %+v", cp)
			}
			// Timestamps are Redis time.
			if d := cp.StartedAt.Sub(redisNow); d < -time.Second || d > 5*time.Second {
				t.Fatalf("StartedAt %v, Redis TIME %v", cp.StartedAt, redisNow)
			}
			if cp.UpdatedAt.IsZero() || cp.UpdatedAt.Before(cp.StartedAt) {
				t.Fatalf("UpdatedAt %v, StartedAt %v", cp.UpdatedAt, cp.StartedAt)
			}
			if r := checkpoints.Decide(cp); r.Mode != checkpoints.Restart || r.Stage != "pulling" {
				t.Fatalf("Decide(new) = %+v, want restart at pulling", r)
			}
			// The record carries the key's identity for the TaskView.
			rec, err := b.Client.HGetAll(ctx, f.ks.Task(k)).Result()
			if err != nil {
				t.Fatal(err)
			}
			if rec["key"] != k.String() || rec["subject"] != k.Subject() || rec["scope"] != k.Scope() || rec["status"] != "running" {
				t.Fatalf("record = %v", rec)
			}

			cursor := []byte{0, 255, 10}
			if err := f.store.SaveProgress(ctx, lease, "run-1", cursor); err != nil {
				t.Fatalf("SaveProgress: %v", err)
			}
			cp = f.load(t, k)
			if !bytes.Equal(cp.Cursor, cursor) || cp.Completed != 0 || cp.Stage != "pulling" {
				t.Fatalf("after SaveProgress: %+v", cp)
			}
			if r := checkpoints.Decide(cp); r.Mode != checkpoints.Resume || r.StageIndex != 0 || !bytes.Equal(r.Cursor, cursor) {
				t.Fatalf("Decide(progress) = %+v, want resume at 0 with the cursor", r)
			}

			// Wrong stage names are refused and change nothing.
			for _, wrong := range []string{"merging", "pushing", "nope", ""} {
				if _, err := f.store.Advance(ctx, lease, "run-1", wrong); !errors.Is(err, checkpoints.ErrStageMismatch) {
					t.Fatalf("Advance(%q) = %v, want ErrStageMismatch", wrong, err)
				}
			}
			if got := f.load(t, k); got.Completed != 0 || !bytes.Equal(got.Cursor, cursor) {
				t.Fatalf("refused Advance changed the record: %+v", got)
			}

			next, err := f.store.Advance(ctx, lease, "run-1", "pulling")
			if err != nil || next != "merging" {
				t.Fatalf("Advance(pulling) = %q, %v; want merging", next, err)
			}
			cp = f.load(t, k)
			if cp.Completed != 1 || cp.Stage != "merging" || cp.Cursor != nil {
				t.Fatalf("after Advance(pulling): %+v, want 1 done, stage merging, cursor cleared", cp)
			}
			if !reflect.DeepEqual(cp.CompletedStages(), []string{"pulling"}) {
				t.Fatalf("CompletedStages = %v", cp.CompletedStages())
			}
			// A completed stage cannot be completed again.
			if _, err := f.store.Advance(ctx, lease, "run-1", "pulling"); !errors.Is(err, checkpoints.ErrStageMismatch) {
				t.Fatalf("second Advance(pulling) = %v, want ErrStageMismatch", err)
			}
			if next, err = f.store.Advance(ctx, lease, "run-1", "merging"); err != nil || next != "pushing" {
				t.Fatalf("Advance(merging) = %q, %v", next, err)
			}
			if err := f.store.SaveProgress(ctx, lease, "run-1", []byte("page=7")); err != nil {
				t.Fatal(err)
			}
			r := checkpoints.Decide(f.load(t, k))
			if r.Mode != checkpoints.Resume || r.StageIndex != 2 || r.Stage != "pushing" || string(r.Cursor) != "page=7" {
				t.Fatalf("Decide = %+v, want resume at pushing with page=7", r)
			}
			if next, err = f.store.Advance(ctx, lease, "run-1", "pushing"); err != nil || next != "" {
				t.Fatalf("Advance(pushing) = %q, %v; want \"\"", next, err)
			}
			cp = f.load(t, k)
			if cp.Completed != 3 || cp.Stage != "" || cp.Cursor != nil {
				t.Fatalf("after last Advance: %+v", cp)
			}
			if r := checkpoints.Decide(cp); r.Mode != checkpoints.Skip || r.StageIndex != 3 || r.Stage != "" {
				t.Fatalf("Decide(all done) = %+v, want skip", r)
			}
			if _, err := f.store.Advance(ctx, lease, "run-1", "pushing"); !errors.Is(err, checkpoints.ErrStageMismatch) {
				t.Fatalf("Advance after the last stage = %v, want ErrStageMismatch", err)
			}

			// Every write left a history event.
			hist, err := b.Client.LRange(ctx, f.ks.History(k), 0, -1).Result()
			if err != nil {
				t.Fatal(err)
			}
			var events []string
			for _, e := range hist {
				// at, event, runId, source, stage, outcome, owner, fencingToken, error
				f := strings.Split(e, "\x1f")
				if len(f) < 9 || f[2] != "run-1" || f[7] != fmt.Sprint(lease.Token) {
					t.Fatalf("history event %q lacks runId/fencingToken", e)
				}
				events = append(events, f[1])
			}
			want := []string{"started", "progress", "stage", "stage", "progress", "stage"}
			if !reflect.DeepEqual(events, want) {
				t.Fatalf("history events %v, want %v", events, want)
			}
		})
	}
}

// TestBeginSameRunKeepsCheckpoint: a new holder of the same run (after the
// previous holder's lease expired) resumes it; the old holder can no longer
// write.
func TestBeginSameRunKeepsCheckpoint(t *testing.T) {
	st := []string{"pulling", "pushing"}
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			f := newFixture(t, b)
			k := key(t, "course_sync")
			const ttl = 300 * time.Millisecond
			cursor := []byte{0, 255, 10}

			a := f.acquire(t, k, "pod-a", ttl)
			if _, err := f.store.Begin(ctx, a, "run-1", st); err != nil {
				t.Fatal(err)
			}
			if _, err := f.store.Advance(ctx, a, "run-1", "pulling"); err != nil {
				t.Fatal(err)
			}
			if err := f.store.SaveProgress(ctx, a, "run-1", cursor); err != nil {
				t.Fatal(err)
			}
			saved := f.load(t, k)

			b.Advance(ttl) // A crashed: its lease expires
			nb := f.acquire(t, k, "pod-b", 10*time.Second)
			if nb.Token <= a.Token {
				t.Fatalf("B token %d <= A token %d", nb.Token, a.Token)
			}
			// A's writes are refused before B begins...
			if err := f.store.SaveProgress(ctx, a, "run-1", []byte("stale")); !errors.Is(err, leasing.ErrNotHeld) {
				t.Fatalf("A SaveProgress = %v, want ErrNotHeld", err)
			}
			if _, err := f.store.Advance(ctx, a, "run-1", "pushing"); !errors.Is(err, leasing.ErrNotHeld) {
				t.Fatalf("A Advance = %v, want ErrNotHeld", err)
			}
			if got := f.load(t, k); !reflect.DeepEqual(got, saved) {
				t.Fatalf("checkpoint changed by refused writes:\n got %+v\nwant %+v", got, saved)
			}

			// Even the stage list of a new Begin of the same run is ignored:
			// the run keeps its own.
			cp, err := f.store.Begin(ctx, nb, "run-1", []string{"other"})
			if err != nil {
				t.Fatalf("B Begin: %v", err)
			}
			if cp.Completed != 1 || cp.Stage != "pushing" || !bytes.Equal(cp.Cursor, cursor) || !reflect.DeepEqual(cp.Stages, st) {
				t.Fatalf("B checkpoint = %+v, want 1 done, stage pushing, cursor %v, stages %v", cp, cursor, st)
			}
			if cp.Attempt != 2 || cp.Owner != "pod-b" || cp.Token != nb.Token || !cp.StartedAt.Equal(saved.StartedAt) {
				t.Fatalf("B checkpoint = %+v, want attempt 2, owner pod-b, token %d, StartedAt kept", cp, nb.Token)
			}
			r := checkpoints.Decide(cp)
			if r.Mode != checkpoints.Resume || r.StageIndex != 1 || r.Stage != "pushing" || !bytes.Equal(r.Cursor, cursor) {
				t.Fatalf("Decide = %+v, want resume at pushing with %v", r, cursor)
			}
			// ...and after.
			if err := f.store.SaveProgress(ctx, a, "run-1", []byte("stale")); !errors.Is(err, leasing.ErrNotHeld) {
				t.Fatalf("A SaveProgress after B's Begin = %v, want ErrNotHeld", err)
			}
			// A completed stage is not handed out again: B cannot redo it.
			if _, err := f.store.Advance(ctx, nb, "run-1", "pulling"); !errors.Is(err, checkpoints.ErrStageMismatch) {
				t.Fatalf("B Advance(pulling) = %v, want ErrStageMismatch", err)
			}
			if next, err := f.store.Advance(ctx, nb, "run-1", "pushing"); err != nil || next != "" {
				t.Fatalf("B Advance(pushing) = %q, %v", next, err)
			}
			if r := checkpoints.Decide(f.load(t, k)); r.Mode != checkpoints.Skip {
				t.Fatalf("Decide after B finished = %+v, want skip", r)
			}
		})
	}
}

// TestBeginOtherRunResets: Begin of a different run id starts a fresh
// checkpoint, and writes for the old run id are refused even by the lease
// holder.
func TestBeginOtherRunResets(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			f := newFixture(t, b)
			k := key(t, "message_sync")
			lease := f.acquire(t, k, "pod-a", 10*time.Second)
			if _, err := f.store.Begin(ctx, lease, "run-1", stages3); err != nil {
				t.Fatal(err)
			}
			if _, err := f.store.Advance(ctx, lease, "run-1", "pulling"); err != nil {
				t.Fatal(err)
			}
			if err := f.store.SaveProgress(ctx, lease, "run-1", []byte("c")); err != nil {
				t.Fatal(err)
			}
			// Same run again: attempt 2, progress kept.
			cp, err := f.store.Begin(ctx, lease, "run-1", stages3)
			if err != nil || cp.Attempt != 2 || cp.Completed != 1 || string(cp.Cursor) != "c" {
				t.Fatalf("Begin(run-1) again = %+v, %v", cp, err)
			}

			st2 := []string{"backup"}
			cp, err = f.store.Begin(ctx, lease, "run-2", st2)
			if err != nil {
				t.Fatalf("Begin(run-2): %v", err)
			}
			if cp.RunID != "run-2" || cp.Completed != 0 || cp.Cursor != nil || cp.Stage != "backup" ||
				cp.Attempt != 1 || !reflect.DeepEqual(cp.Stages, st2) {
				t.Fatalf("Begin(run-2) = %+v, want a fresh checkpoint", cp)
			}
			if r := checkpoints.Decide(cp); r.Mode != checkpoints.Restart || r.Stage != "backup" {
				t.Fatalf("Decide = %+v, want restart", r)
			}
			if err := f.store.SaveProgress(ctx, lease, "run-1", []byte("old")); !errors.Is(err, leasing.ErrNotHeld) {
				t.Fatalf("SaveProgress for run-1 = %v, want ErrNotHeld", err)
			}
			if _, err := f.store.Advance(ctx, lease, "run-1", "merging"); !errors.Is(err, leasing.ErrNotHeld) {
				t.Fatalf("Advance for run-1 = %v, want ErrNotHeld", err)
			}
			if got := f.load(t, k); got.RunID != "run-2" || got.Cursor != nil {
				t.Fatalf("record after stale run-1 writes = %+v", got)
			}
		})
	}
}

// TestBeginKeepsTheLastSuccess: a new run begun with the standalone API on
// a record whose run ended done (the engine keeps that time in finishedAt
// alone) moves it to lastSuccessAt, which minInterval throttling reads.
func TestBeginKeepsTheLastSuccess(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			f := newFixture(t, b)
			k := key(t, "message_sync")
			task := f.ks.Task(k)
			if err := b.Client.HSet(ctx, task, "runId", "run-0", "status", "done", "finishedAt", "1700000000000").Err(); err != nil {
				t.Fatal(err)
			}
			lease := f.acquire(t, k, "pod-a", 10*time.Second)
			if _, err := f.store.Begin(ctx, lease, "run-1", stages3); err != nil {
				t.Fatal(err)
			}
			got, err := b.Client.HMGet(ctx, task, "lastSuccessAt", "finishedAt").Result()
			if err != nil || got[0] != "1700000000000" || got[1] != "" {
				t.Fatalf("lastSuccessAt, finishedAt after Begin = %v, %v; want the done run's time, empty", got, err)
			}
		})
	}
}

func TestBeginValidation(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			f := newFixture(t, b)
			k := key(t, "course_sync")
			lease := f.acquire(t, k, "pod-a", 10*time.Second)
			if _, err := f.store.Begin(ctx, lease, "", stages3); !errors.Is(err, checkpoints.ErrConfig) {
				t.Errorf("Begin with empty run id = %v, want ErrConfig", err)
			}
			if _, err := f.store.Begin(ctx, lease, "run-1", []string{"a,b"}); !errors.Is(err, checkpoints.ErrConfig) {
				t.Errorf("Begin with bad stages = %v, want ErrConfig", err)
			}
			if _, err := f.store.Load(ctx, k); !errors.Is(err, checkpoints.ErrNotFound) {
				t.Errorf("invalid Begins created a record: %v", err)
			}
			// Begin without the lease (wrong token, or no lease at all).
			stale := lease
			stale.Token++
			if _, err := f.store.Begin(ctx, stale, "run-1", stages3); !errors.Is(err, leasing.ErrNotHeld) {
				t.Errorf("Begin with a wrong token = %v, want ErrNotHeld", err)
			}
			other := f.acquire(t, key(t, "backup"), "pod-a", 10*time.Second)
			other.Key = taskkey.MustNew("nobody", "backup")
			if _, err := f.store.Begin(ctx, other, "run-1", stages3); !errors.Is(err, leasing.ErrNotHeld) {
				t.Errorf("Begin without a lease = %v, want ErrNotHeld", err)
			}
			// Writes before any Begin are refused: there is no run record.
			if err := f.store.SaveProgress(ctx, lease, "run-1", []byte("x")); !errors.Is(err, leasing.ErrNotHeld) {
				t.Errorf("SaveProgress before Begin = %v, want ErrNotHeld", err)
			}
			if _, err := f.store.Advance(ctx, lease, "run-1", "pulling"); !errors.Is(err, leasing.ErrNotHeld) {
				t.Errorf("Advance before Begin = %v, want ErrNotHeld", err)
			}
			if n, _ := b.Client.Exists(ctx, f.ks.Task(k), f.ks.Task(other.Key)).Result(); n != 0 {
				t.Errorf("refused writes created %d records", n)
			}
		})
	}
}

// TestHistoryCapAndEvents: history is capped, and each write publishes the
// record (without the binary cursor) on the partition's channel.
func TestHistoryCapAndEvents(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			f := newFixture(t, b)
			store, err := checkpoints.NewStore(b.Client, checkpoints.Config{HistoryCap: 5})
			if err != nil {
				t.Fatal(err)
			}
			k := key(t, "course_sync")
			lease := f.acquire(t, k, "pod-a", 10*time.Second)

			// Views are published only while the partition's watch key exists.
			if err := b.Client.Set(ctx, f.ks.Watch(f.ks.Partition(k)), "1", time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			sub := b.Client.Subscribe(ctx, f.ks.Events(f.ks.Partition(k)))
			defer sub.Close()
			if _, err := sub.Receive(ctx); err != nil { // subscription confirmation
				t.Fatal(err)
			}
			if _, err := store.Begin(ctx, lease, "run-1", stages3); err != nil {
				t.Fatal(err)
			}
			for i := range 300 {
				if err := store.SaveProgress(ctx, lease, "run-1", []byte{byte(i), 0xff}); err != nil {
					t.Fatal(err)
				}
			}
			n, err := b.Client.LLen(ctx, f.ks.History(k)).Result()
			if err != nil {
				t.Fatal(err)
			}
			if n != 5 {
				t.Fatalf("history holds %d events after 301 writes with cap 5", n)
			}

			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			msg, err := sub.ReceiveMessage(rctx)
			if err != nil {
				t.Fatalf("no event published: %v", err)
			}
			var view map[string]any
			if err := json.Unmarshal([]byte(msg.Payload), &view); err != nil {
				t.Fatalf("event %q is not JSON: %v", msg.Payload, err)
			}
			if view["key"] != k.String() || view["runId"] != "run-1" || view["status"] != "running" {
				t.Fatalf("event = %v", view)
			}
			if _, ok := view["cursor"]; ok {
				t.Fatalf("event carries the binary cursor: %v", view)
			}
		})
	}
}
