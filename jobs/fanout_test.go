package jobs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/taskkey"
)

// TestSubmitManyOccurrenceExactlyOnce: SubmitMany routes each subject like
// Submit, across partitions; with an Occurrence, repeating the batch (a
// resumed fan-out) or sending an older occurrence late (a deposed leader)
// answers duplicate and writes nothing.
func TestSubmitManyOccurrenceExactlyOnce(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			e := newEnv(t, b.Client, Config{Prefix: "sm", Partitions: 8, Jobs: []Job{clJob("course_sync", Stage{Name: "pulling", Handler: &counter{}})}})
			var subjects []string
			for i := range 300 { // several chunks in several partitions
				subjects = append(subjects, fmt.Sprintf("s%03d", i))
			}
			clSubmit(t, e.reg, "s007", "course_sync", SourceManual, "") // already active: joins
			at := time.Unix(1_800_000_000, 0)
			opts := SubmitManyOptions{Source: SourceSchedule, Occurrence: &Occurrence{Schedule: "nightly", At: at}}
			out, err := e.reg.SubmitMany(ctx, "course_sync", subjects, opts)
			if err != nil {
				t.Fatal(err)
			}
			for i, o := range out {
				want := OutcomeStarted
				if subjects[i] == "s007" {
					want = OutcomeJoined
				}
				if o != want {
					t.Fatalf("%s: outcome %s, want %s", subjects[i], o, want)
				}
			}
			again, err := e.reg.SubmitMany(ctx, "course_sync", subjects, opts)
			if err != nil {
				t.Fatal(err)
			}
			older := opts
			older.Occurrence = &Occurrence{Schedule: "nightly", At: at.Add(-time.Hour)}
			late, err := e.reg.SubmitMany(ctx, "course_sync", subjects[:10], older)
			if err != nil {
				t.Fatal(err)
			}
			for i, o := range slices.Concat(again, late) {
				if o != OutcomeDuplicate {
					t.Fatalf("repeat %d: outcome %s, want duplicate", i, o)
				}
			}
			// Another schedule's occurrence is its own.
			other := opts
			other.Occurrence = &Occurrence{Schedule: "hourly", At: at}
			if out, err := e.reg.SubmitMany(ctx, "course_sync", subjects[:1], other); err != nil || out[0] != OutcomeJoined {
				t.Fatalf("other schedule: %v %v, want joined", out, err)
			}
			for _, s := range subjects {
				evs := clHistory(t, e.reg, s, "course_sync")
				n := 0
				for _, ev := range evs {
					if ev.Source == string(SourceSchedule) {
						n++
					}
				}
				want := 1
				if s == "s000" {
					want = 2 // nightly and hourly
				}
				if n != want {
					t.Fatalf("%s: %d schedule requests in history, want %d: %v", s, n, want, clEventNames(evs))
				}
			}
			if n := polQueueDepth(t, e.reg); n != 300 {
				t.Errorf("%d requests queued, want 300 (one run per subject)", n)
			}
		})
	}
}

// TestSubmitManyBadInputWritesNothing: one invalid subject rejects the
// whole batch before anything is sent.
func TestSubmitManyBadInputWritesNothing(t *testing.T) {
	mini := redistest.StartMini(t)
	e := newEnv(t, mini.Client(t), Config{Prefix: "sb", Jobs: []Job{clJob("course_sync", Stage{Name: "pulling", Handler: &counter{}})}})
	ctx := context.Background()
	if _, err := e.reg.SubmitMany(ctx, "course_sync", []string{"ok", "not ok"}, SubmitManyOptions{}); !errors.Is(err, taskkey.ErrInvalid) {
		t.Fatalf("err %v, want taskkey.ErrInvalid", err)
	}
	if _, err := e.reg.SubmitMany(ctx, "nope", []string{"ok"}, SubmitManyOptions{}); !errors.Is(err, ErrUnknownScope) {
		t.Fatalf("err %v, want ErrUnknownScope", err)
	}
	if _, err := e.reg.SubmitMany(ctx, "course_sync", []string{"ok"}, SubmitManyOptions{Policy: "maybe"}); !errors.Is(err, ErrInvalidPolicy) {
		t.Fatalf("err %v, want ErrInvalidPolicy", err)
	}
	if keys := mini.Keys(); len(keys) != 0 {
		t.Fatalf("keys written by bad input: %v", keys)
	}
}

// TestSubmitManyAfterScriptFlush: EVALSHA answered NOSCRIPT (a SCRIPT
// FLUSH, a restarted Redis) is sent again after loading the script, once.
func TestSubmitManyAfterScriptFlush(t *testing.T) {
	s := redistest.StartServer(t)
	rdb := s.Client(t)
	ctx := context.Background()
	e := newEnv(t, rdb, Config{Prefix: "sf", Jobs: []Job{clJob("course_sync", Stage{Name: "pulling", Handler: &counter{}})}})
	if _, err := e.reg.SubmitMany(ctx, "course_sync", []string{"a"}, SubmitManyOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	out, err := e.reg.SubmitMany(ctx, "course_sync", []string{"a", "b", "c"}, SubmitManyOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(out, []Outcome{OutcomeJoined, OutcomeStarted, OutcomeStarted}) {
		t.Fatalf("outcomes %v after SCRIPT FLUSH", out)
	}
}
