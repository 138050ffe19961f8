package jobs

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/taskkey"
)

// A request's fair-share group (SubmitOptions.Group) is written to the
// task record, field "group", by the request that starts a run, and only
// when it names one: a join does not change it, a follow-up keeps it, and
// a run started without one drops the one a run before it left. Traced
// requests carry it in the same argument, before the traceparent.
func TestSubmitGroup(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		for _, traced := range []bool{false, true} {
			name := b.Name
			if traced {
				name += "/traced"
			}
			t.Run(name, func(t *testing.T) {
				cfg := Config{Prefix: "grp", Partitions: 2, Jobs: []Job{clJob("course_sync", Stage{Name: "a", Handler: &counter{}})}}
				if traced {
					cfg.Prefix = "grpt"
					cfg.TracerProvider, _ = recordingProvider(t)
				}
				e := newEnv(t, b.Client, cfg)
				ctx := context.Background()
				group := func(subject string) (string, bool) {
					t.Helper()
					g, err := b.Client.HGet(ctx, e.reg.ks.Task(taskkey.MustNew(subject, "course_sync")), "group").Result()
					if errors.Is(err, redis.Nil) {
						return "", false
					}
					if err != nil {
						t.Fatal(err)
					}
					return g, true
				}
				submit := func(subject string, opts SubmitOptions, want Outcome) SubmitResult {
					t.Helper()
					res, err := e.reg.Submit(ctx, subject, "course_sync", opts)
					if err != nil || res.Outcome != want {
						t.Fatalf("submit %s %+v: %s, %v; want %s", subject, opts, res.Outcome, err, want)
					}
					return res
				}
				wantGroup := func(subject, want string) {
					t.Helper()
					g, ok := group(subject)
					if want == "" && ok {
						t.Fatalf("%s: field group = %q, want none", subject, g)
					}
					if g != want {
						t.Fatalf("%s: group %q, want %q", subject, g, want)
					}
				}
				cancel := func(subject string) {
					t.Helper()
					if o, err := e.reg.Cancel(ctx, subject, "course_sync"); err != nil || o != CancelCancelled {
						t.Fatalf("cancel %s: %s, %v", subject, o, err)
					}
				}

				submit("u1", SubmitOptions{Group: "acme:eu"}, OutcomeStarted)
				wantGroup("u1", "acme:eu")
				// Without a group: no field at all.
				submit("u2", SubmitOptions{}, OutcomeStarted)
				wantGroup("u2", "")
				// A group holding the timing's own marks, on a delayed request:
				// both read back whole.
				res := submit("u3", SubmitOptions{Group: "t@1+2~3", Delay: 90 * time.Second}, OutcomeStarted)
				wantGroup("u3", "t@1+2~3")
				if v, err := e.reg.Get(ctx, "u3", "course_sync"); err != nil || v.NotBefore == nil ||
					v.RequestedAt == nil || v.NotBefore.Sub(*v.RequestedAt) != 90*time.Second {
					t.Fatalf("u3 delayed by 90s: %+v, %v (reply %+v)", v, err, res.Task)
				}

				// A join (first and repeated, any group) changes nothing.
				submit("u1", SubmitOptions{Group: "other", Source: SourceForeground}, OutcomeJoined)
				submit("u1", SubmitOptions{Group: "other", Source: SourceForeground}, OutcomeJoined)
				submit("u2", SubmitOptions{Group: "late"}, OutcomeJoined)
				wantGroup("u1", "acme:eu")
				wantGroup("u2", "")
				// A follow-up keeps the group of the run before it.
				submit("u1", SubmitOptions{Group: "c", Policy: PolicyQueue}, OutcomeQueued)
				wantGroup("u1", "acme:eu")

				// The next run started without a group drops the old one; with
				// one, it is that run's.
				cancel("u2")
				submit("u2", SubmitOptions{Group: "b"}, OutcomeStarted)
				wantGroup("u2", "b")
				cancel("u2")
				submit("u2", SubmitOptions{}, OutcomeStarted)
				wantGroup("u2", "")
				cancel("u2")
				submit("u2", SubmitOptions{Group: "b2"}, OutcomeStarted)
				cancel("u2")
				// A fan-out names no group: the run it starts has none.
				if out, err := e.reg.SubmitMany(ctx, "course_sync", []string{"u2"}, SubmitManyOptions{Source: SourceSchedule}); err != nil || out[0] != OutcomeStarted {
					t.Fatalf("submit many: %v, %v", out, err)
				}
				wantGroup("u2", "")
			})
		}
	}
}

// A bad group is refused with ErrInvalidGroup before anything reaches
// Redis; the limits themselves are valid.
func TestSubmitInvalidGroup(t *testing.T) {
	t.Parallel()
	e, m := newBadEnv(t)
	ctx := context.Background()
	for _, g := range []string{
		strings.Repeat("g", GroupMax+1), "a b", "a|b", "|", "tab\there", "nl\n", "nul\x00", "\x7f",
		"bad\xffutf8", "nbsp\u00a0", "zero\u200bwidth", " lead", "trail ",
	} {
		for _, subject := range []string{"u1", "u9"} { // an existing key, a new one
			before := badSnap(m)
			_, err := e.reg.Submit(ctx, subject, "course_sync", SubmitOptions{Group: g})
			if !errors.Is(err, ErrInvalidGroup) {
				t.Errorf("Submit(%s, group %q): %v, want ErrInvalidGroup", subject, g, err)
			}
			badSameSnap(t, "Submit("+subject+", group "+g+")", before, m)
		}
		if ValidateGroup(g) == nil {
			t.Errorf("ValidateGroup(%q) = nil", g)
		}
	}
	for _, g := range []string{"", strings.Repeat("g", GroupMax), "acme", "acme:eu", "t@1+2~3", "租户", "a-b_c.d/e"} {
		if err := ValidateGroup(g); err != nil {
			t.Errorf("ValidateGroup(%q) = %v, want nil", g, err)
		}
	}
	if _, err := e.reg.Submit(ctx, "u9", "course_sync", SubmitOptions{Group: strings.Repeat("g", GroupMax)}); err != nil {
		t.Errorf("Submit with a %d-byte group: %v", GroupMax, err)
	}
}
