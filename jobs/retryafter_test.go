package jobs

import (
	"context"
	"errors"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tasklease/tasklease/internal/redistest"
)

// raStage asks to be retried after delay on its first call (through stage
// wrapping a RetryAfter, or an HTTP 429, or an exec exit code), then
// succeeds.
type raStage struct {
	calls atomic.Int32
	delay time.Duration
}

func (s *raStage) RunStage(ctx context.Context, run *Run) error {
	if s.calls.Add(1) == 1 {
		return RetryAfter(s.delay, errors.New("remote: 429 too many requests"))
	}
	return nil
}

// raCheck runs one run of job (maxAttempts 1: a counted retry would fail
// it) whose only stage asks once to be retried after delay, and checks
// that the run ends done at attempt 1, having waited at least delay of
// Redis time between the deferral and its second start.
func raCheck(t *testing.T, b redistest.Backend, stage Handler, delay time.Duration, calls func() int) {
	t.Helper()
	job := clJob("sync", Stage{Name: "pushing", Handler: stage})
	job.Retry = RetryPolicy{MaxAttempts: 1, Backoff: 10 * time.Millisecond}
	e := newEnv(t, b.Client, Config{Prefix: "ra", Jobs: []Job{job}})
	e.startRunner(RunnerConfig{ID: "pod-ra"})
	clSubmit(t, e.reg, "u1", "sync", SourceManual, "")
	v := e.waitStatus("u1", "sync", 10*time.Second, StatusRetrying, StatusDone, StatusFailed)
	if v.Status != StatusRetrying || v.Attempt != 0 {
		t.Fatalf("after the deferral: %s at attempt %d (%s), want retrying with the attempt given back (0)", v.Status, v.Attempt, v.LastError)
	}
	b.Advance(delay)
	v = e.waitStatus("u1", "sync", 20*time.Second, StatusDone, StatusFailed)
	if v.Status != StatusDone || v.Attempt != 1 || calls() != 2 {
		t.Fatalf("run %s at attempt %d of %d after %d stage calls (%s); want done at attempt 1 after 2",
			v.Status, v.Attempt, v.MaxAttempts, calls(), v.LastError)
	}
	evs := clHistory(t, e.reg, "u1", "sync")
	var deferred, restarted time.Time
	for i := len(evs) - 1; i >= 0; i-- { // oldest first
		ev := evs[i]
		switch {
		case ev.Event == "retry-scheduled" && strings.HasPrefix(ev.Outcome, "deferred"):
			deferred = ev.At
		case ev.Event == "started" && !deferred.IsZero() && restarted.IsZero():
			restarted = ev.At
		}
	}
	if deferred.IsZero() || restarted.IsZero() {
		t.Fatalf("history lacks the deferral and the start after it: %+v", evs)
	}
	if got := restarted.Sub(deferred); got < delay {
		t.Errorf("restarted %s after the deferral (Redis time), want at least %s", got, delay)
	}
}

// A stage that returns RetryAfter is run again after the delay, and the
// attempt is not counted: with maxAttempts 1 the run still ends done.
func TestRetryAfterDoesNotCountTheAttempt(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			s := &raStage{delay: 1500 * time.Millisecond}
			raCheck(t, b, s, s.delay, func() int { return int(s.calls.Load()) })
		})
	}
}

// An HTTP stage answered 429 with Retry-After defers the run by that long.
func TestHTTPStageRetryAfter(t *testing.T) {
	t.Parallel()
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			var calls atomic.Int32
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if calls.Add(1) == 1 {
					w.Header().Set("Retry-After", "1")
					http.Error(w, "slow down", http.StatusTooManyRequests)
				}
			}))
			t.Cleanup(srv.Close)
			raCheck(t, b, &HTTPStage{URL: srv.URL}, time.Second, func() int { return int(calls.Load()) })
		})
	}
}

// An exec stage that exits RetryAfterExitCode with "retry-after: 1s" on
// stderr defers the run by that long.
func TestExecStageRetryAfter(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("sh")
	}
	t.Parallel()
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			dir := t.TempDir()
			flag, count := filepath.Join(dir, "once"), filepath.Join(dir, "calls")
			script := `echo x >> "$COUNT"; if [ ! -e "$FLAG" ]; then : > "$FLAG"; echo "remote busy" >&2; echo "retry-after: 1s" >&2; exit 75; fi`
			st := &ExecStage{Command: []string{"sh", "-c", script}, Env: []string{"FLAG=" + flag, "COUNT=" + count}}
			raCheck(t, b, st, time.Second, func() int { return countLines(t, count) })
		})
	}
}

func countLines(t *testing.T, path string) int {
	t.Helper()
	b, err := readFileIfExists(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "\n")
}

func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"2", 2 * time.Second, true},
		{" 120 ", 2 * time.Minute, true},
		{"0", 0, true},
		{"999999999", RetryAfterMax, true},
		{"Thu, 03 Dec 2026 12:00:30 GMT", 30 * time.Second, true},
		{"Thu, 03 Dec 2026 11:00:00 GMT", 0, true}, // in the past: now
		{"", 0, false},
		{"-1", 0, false},
		{"soon", 0, false},
		{"1.5", 0, false},
	} {
		got, ok := parseRetryAfter(c.in, now)
		if got != c.want || ok != c.ok {
			t.Errorf("parseRetryAfter(%q) = %v, %v; want %v, %v", c.in, got, ok, c.want, c.ok)
		}
	}
	for in, want := range map[string]time.Duration{
		"retry-after: 2s\n":                      2 * time.Second,
		"busy\nretry-after: 1m30s\n":             90 * time.Second,
		"retry-after: 5\n":                       5 * time.Second,
		"retry-after: 1s\nretry-after: 3s":       3 * time.Second, // the last one
		"retry-after: 3s\nother output\n":        3 * time.Second,
		"no delay given\n":                       0,
		"retry-after: -2s\n":                     0,
		"retry-after: later\n":                   0,
		"  retry-after:   250ms  \ntrailing\n\n": 250 * time.Millisecond,
	} {
		if got := parseExecRetryAfter(in); got != want {
			t.Errorf("parseExecRetryAfter(%q) = %v, want %v", in, got, want)
		}
	}
	if d := RetryAfter(48*time.Hour, nil).(*RetryAfterError).Delay; d != RetryAfterMax {
		t.Errorf("RetryAfter(48h) delay %v, want the cap %v", d, RetryAfterMax)
	}
}

func FuzzParseRetryAfter(f *testing.F) {
	for _, s := range []string{"2", "Thu, 03 Dec 2026 12:00:30 GMT", "", "-1", "1e9", "retry-after: 2s"} {
		f.Add(s)
	}
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, s string) {
		if d, ok := parseRetryAfter(s, now); d < 0 || (!ok && d != 0) {
			t.Fatalf("parseRetryAfter(%q) = %v, %v", s, d, ok)
		}
		if d := parseExecRetryAfter(s); d < 0 {
			t.Fatalf("parseExecRetryAfter(%q) = %v", s, d)
		}
	})
}

// readFileIfExists is os.ReadFile with a missing file read as empty.
func readFileIfExists(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return b, err
}
