package jobs

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tasklease/tasklease/internal/redistest"
)

// stamps is a stage that records when each run was admitted: its slot
// token, which a limiter takes as Redis time in µs (or one more than the
// last), so admissions are timed by the limiter's own clock, free of the
// jitter between an admission and its stage's start on a loaded machine.
type stamps struct {
	mu sync.Mutex
	at []time.Time
}

func (s *stamps) RunStage(ctx context.Context, run *Run) error {
	sl := run.LimiterSlots()
	if len(sl) != 1 {
		return Permanent(fmt.Errorf("slots %v, want one", sl))
	}
	s.mu.Lock()
	s.at = append(s.at, time.UnixMicro(sl[0].Token))
	s.mu.Unlock()
	return nil
}

func (s *stamps) times() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.at)
}

// rateSeconds is how long TestLimiterRate saturates its limiter
// (TASKLEASE_LIMITER_RATE_SECONDS; .ci/run runs the 60).
func rateSeconds(t *testing.T) int {
	if s := os.Getenv("TASKLEASE_LIMITER_RATE_SECONDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 2 {
			t.Fatalf("TASKLEASE_LIMITER_RATE_SECONDS=%q: want seconds >= 2", s)
		}
		return n
	}
	return 8
}

// A rate of 20/s with a burst of 5, saturated by three runners: in every
// one-second window at most 25 starts, and over the whole run the rate's
// exact count (20/s × D + 5, within 5 %): the limiter is exact, not
// merely conservative. Starts are timed by the limiter's clock (stamps).
func TestLimiterRate(t *testing.T) {
	d := rateSeconds(t)
	for _, b := range redistest.Backends(t, redistest.WithSharedCluster) {
		if !b.Real { // real time: the embedded Redis's clock is the test's
			continue
		}
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			st := &stamps{}
			e := newEnv(t, b.Client, Config{Prefix: "limrate", Limiters: []Limiter{{Name: "api", Rate: Rate{Count: 20, Per: time.Second, Burst: 5}}},
				Jobs: []Job{{Scope: "sync", Limiters: []string{"api"}, Stages: []Stage{{Name: "call", Handler: st}}}}})
			subjects := make([]string, 25*d+200) // more than the rate lets start
			for i := range subjects {
				subjects[i] = fmt.Sprintf("u%d", i)
			}
			if _, err := e.reg.SubmitMany(ctx, "sync", subjects, SubmitManyOptions{Source: SourceSchedule}); err != nil {
				t.Fatal(err)
			}
			for i := range 3 {
				e.startRunner(RunnerConfig{ID: fmt.Sprintf("r%d", i), Concurrency: 16})
			}
			waitFor(t, time.Duration(d+30)*time.Second, fmt.Sprintf("%d s of starts", d), func() bool {
				at := st.times()
				return len(at) > 0 && len(at) >= 20*d+5+10
			})
			at := st.times()
			slices.SortFunc(at, func(a, b time.Time) int { return a.Compare(b) })
			worst := 0
			for i := range at {
				n := 0
				for j := i; j < len(at) && at[j].Sub(at[i]) < time.Second; j++ {
					n++
				}
				worst = max(worst, n)
			}
			total := 0
			for _, x := range at {
				if x.Sub(at[0]) < time.Duration(d)*time.Second {
					total++
				}
			}
			want := float64(20*d + 5)
			t.Logf("%d starts in %d s (exact: %.0f), at most %d in a second", total, d, want, worst)
			if worst > 25 {
				t.Errorf("%d starts within one second, want at most 25 (20/s + burst 5)", worst)
			}
			if float64(total) < want*0.95 || float64(total) > want*1.05 {
				t.Errorf("%d starts in %d s, want %.0f ± 5%%", total, d, want)
			}
		})
	}
}

// A remote answers 429 with Retry-After: 2. The run is not charged an
// attempt and resumes at its stage at least 2 s later; with
// holdOnRetryAfter no other run of the limiter starts in those 2 s,
// without it the others go on.
func TestLimiterHoldOnRetryAfter(t *testing.T) {
	for _, b := range redistest.Backends(t, redistest.WithSharedCluster) {
		if !b.Real {
			continue
		}
		for _, hold := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/hold=%v", b.Name, hold), func(t *testing.T) {
				ctx := context.Background()
				type call struct {
					subject string
					attempt int
					at      time.Time
				}
				var mu sync.Mutex
				var calls []call
				first := true
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					var body struct {
						Subject string `json:"subject"`
						Attempt int    `json:"attempt"`
					}
					_ = json.NewDecoder(r.Body).Decode(&body)
					mu.Lock()
					defer mu.Unlock()
					calls = append(calls, call{body.Subject, body.Attempt, time.Now()})
					if body.Subject == "u0" && first {
						first = false
						w.Header().Set("Retry-After", "2")
						w.WriteHeader(http.StatusTooManyRequests)
					}
				}))
				defer srv.Close()
				e := newEnv(t, b.Client, Config{Prefix: fmt.Sprintf("limhold%v", hold),
					Limiters: []Limiter{{Name: "remote", Concurrency: 5, HoldOnRetryAfter: hold}},
					Jobs:     []Job{{Scope: "sync", Limiters: []string{"remote"}, Stages: []Stage{{Name: "push", Handler: &HTTPStage{URL: srv.URL}}}}}})
				e.startRunner(RunnerConfig{ID: "r1"})
				if _, err := e.reg.Submit(ctx, "u0", "sync", SubmitOptions{}); err != nil {
					t.Fatal(err)
				}
				e.waitStatus("u0", "sync", 10*time.Second, StatusRetrying)
				mu.Lock()
				told := calls[0].at
				mu.Unlock()
				for i := 1; i <= 5; i++ {
					if _, err := e.reg.Submit(ctx, fmt.Sprintf("u%d", i), "sync", SubmitOptions{}); err != nil {
						t.Fatal(err)
					}
				}
				for i := 0; i <= 5; i++ {
					e.waitStatus(fmt.Sprintf("u%d", i), "sync", 15*time.Second, StatusDone)
				}
				mu.Lock()
				defer mu.Unlock()
				early := 0
				for _, c := range calls[1:] {
					if c.subject == "u0" && (c.attempt != 1 || c.at.Sub(told) < 2*time.Second) {
						t.Errorf("u0 called again at attempt %d after %s, want attempt 1 after >= 2s", c.attempt, c.at.Sub(told))
					}
					if c.subject != "u0" && c.at.Sub(told) < 2*time.Second {
						early++
					}
				}
				if hold && early > 0 {
					t.Errorf("%d runs started within the 2 s the remote asked for, want none (holdOnRetryAfter)", early)
				}
				if !hold && early != 5 {
					t.Errorf("without holdOnRetryAfter %d of 5 runs started within the 2 s, want all", early)
				}
				if v, _ := e.reg.Get(ctx, "u0", "sync"); v.Attempt != 1 {
					t.Errorf("u0 ended at attempt %d, want 1", v.Attempt)
				}
			})
		}
	}
}
