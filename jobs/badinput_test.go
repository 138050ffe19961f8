package jobs

// Bad input is refused with a typed error before anything reaches Redis.

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/taskkey"
)

// badSnapshot is what Redis holds and how many commands it has served.
type badSnapshot struct {
	keys     []string
	commands int
}

func badSnap(m *redistest.Mini) badSnapshot {
	k := m.Keys()
	slices.Sort(k)
	return badSnapshot{keys: k, commands: m.CommandCount()}
}

func badSameSnap(t *testing.T, what string, before badSnapshot, m *redistest.Mini) {
	t.Helper()
	after := badSnap(m)
	if !slices.Equal(before.keys, after.keys) {
		t.Errorf("%s changed the keys:\nbefore %v\nafter  %v", what, before.keys, after.keys)
	}
	if after.commands != before.commands {
		t.Errorf("%s sent %d command(s) to Redis, want 0", what, after.commands-before.commands)
	}
}

func newBadEnv(t *testing.T) (*testEnv, *redistest.Mini) {
	t.Helper()
	m := redistest.StartMini(t)
	c := &counter{}
	e := newEnv(t, m.Client(t), Config{Prefix: "bad", Jobs: []Job{
		clJob("course_sync", Stage{Name: "pulling", Handler: c}, Stage{Name: "pushing", Handler: c}),
	}})
	// Some state, so "nothing written" is measured against a live keyspace.
	clSubmit(t, e.reg, "u1", "course_sync", SourceManual, "")
	return e, m
}

func TestBadInputSubmitGetHistoryCancelWriteNothing(t *testing.T) {
	t.Parallel()
	e, m := newBadEnv(t)
	ctx := context.Background()
	ops := map[string]func(subject, scope string) error{
		"Submit": func(su, sc string) error { _, err := e.reg.Submit(ctx, su, sc, SubmitOptions{}); return err },
		"Get":    func(su, sc string) error { _, err := e.reg.Get(ctx, su, sc); return err },
		"History": func(su, sc string) error {
			_, err := e.reg.History(ctx, su, sc, 10)
			return err
		},
		"Cancel": func(su, sc string) error { _, err := e.reg.Cancel(ctx, su, sc); return err },
	}
	keys := []struct {
		name, subject, scope string
		want                 error
	}{
		{"empty subject", "", "course_sync", taskkey.ErrInvalid},
		{"space in subject", "u 1", "course_sync", taskkey.ErrInvalid},
		{"pipe in subject", "u|1", "course_sync", taskkey.ErrInvalid},
		{"brace in subject", "u{1}", "course_sync", taskkey.ErrInvalid},
		{"non-ascii subject", "ü1", "course_sync", taskkey.ErrInvalid},
		{"subject starting with -", "-u1", "course_sync", taskkey.ErrInvalid},
		{"subject starting with .", ".u1", "course_sync", taskkey.ErrInvalid},
		{"subject of 129 bytes", strings.Repeat("a", 129), "course_sync", taskkey.ErrInvalid},
		{"newline in subject", "u1\n", "course_sync", taskkey.ErrInvalid},
		{"empty scope", "u1", "", taskkey.ErrInvalid},
		{"upper-case scope", "u1", "Course_sync", taskkey.ErrInvalid},
		{"scope starting with digit", "u1", "1course", taskkey.ErrInvalid},
		{"dash in scope", "u1", "course-sync", taskkey.ErrInvalid},
		{"scope of 65 bytes", "u1", "a" + strings.Repeat("b", 64), taskkey.ErrInvalid},
		{"unknown scope", "u1", "message_sync", ErrUnknownScope},
		{"unknown scope, new subject", "u2", "backup", ErrUnknownScope},
	}
	for _, k := range keys {
		for name, op := range ops {
			before := badSnap(m)
			err := op(k.subject, k.scope)
			if !errors.Is(err, k.want) {
				t.Errorf("%s(%s): %v, want %v", name, k.name, err, k.want)
			}
			badSameSnap(t, name+"("+k.name+")", before, m)
		}
	}
	// The limits themselves are valid.
	if _, err := e.reg.Get(ctx, strings.Repeat("a", 128), "course_sync"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get of a 128-byte subject: %v, want ErrNotFound (valid, never ran)", err)
	}

	for _, tc := range []struct {
		name string
		opts SubmitOptions
		want error
	}{
		{"source cron", SubmitOptions{Source: "cron"}, ErrInvalidSource},
		{"source Manual", SubmitOptions{Source: "Manual"}, ErrInvalidSource},
		{"policy always", SubmitOptions{Policy: "always"}, ErrInvalidPolicy},
		{"policy JOIN", SubmitOptions{Source: SourceManual, Policy: "JOIN"}, ErrInvalidPolicy},
	} {
		for _, subject := range []string{"u1", "u9"} { // an existing key, a new one
			before := badSnap(m)
			if _, err := e.reg.Submit(ctx, subject, "course_sync", tc.opts); !errors.Is(err, tc.want) {
				t.Errorf("Submit(%s, %s): %v, want %v", subject, tc.name, err, tc.want)
			}
			badSameSnap(t, "Submit("+subject+", "+tc.name+")", before, m)
		}
	}
}

func TestBadInputListSubjectsCancelSubjectWriteNothing(t *testing.T) {
	t.Parallel()
	e, m := newBadEnv(t)
	ctx := context.Background()
	cases := []struct {
		name string
		call func() error
		want error // nil: any error
	}{
		{"List bad status", func() error { _, err := e.reg.List(ctx, ListOptions{Status: "finished"}); return err }, nil},
		{"List empty-looking status", func() error { _, err := e.reg.List(ctx, ListOptions{Status: " "}); return err }, nil},
		{"List unknown scope", func() error { _, err := e.reg.List(ctx, ListOptions{Scope: "nope"}); return err }, ErrUnknownScope},
		{"List bad subject", func() error { _, err := e.reg.List(ctx, ListOptions{Subject: "a b"}); return err }, taskkey.ErrInvalid},
		{"Subjects unknown scope", func() error { _, err := e.reg.Subjects(ctx, "nope"); return err }, ErrUnknownScope},
		{"CancelSubject bad subject", func() error { _, err := e.reg.CancelSubject(ctx, "u|1"); return err }, taskkey.ErrInvalid},
		{"CancelSubject empty subject", func() error { _, err := e.reg.CancelSubject(ctx, ""); return err }, taskkey.ErrInvalid},
	}
	for _, tc := range cases {
		before := badSnap(m)
		err := tc.call()
		switch {
		case err == nil:
			t.Errorf("%s: no error", tc.name)
		case tc.want != nil && !errors.Is(err, tc.want):
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
		badSameSnap(t, tc.name, before, m)
	}
	// Sanity: the valid forms work and still see the one task.
	if vs, err := e.reg.List(ctx, ListOptions{Status: StatusQueued}); err != nil || len(vs) != 1 {
		t.Errorf("List(queued) = %d views, %v; want the one queued task", len(vs), err)
	}
}
