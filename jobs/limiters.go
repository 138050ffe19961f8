package jobs

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ErrInvalidRate: a rate is not "N/s", "N/m" or "N/h" with N >= 1.
var ErrInvalidRate = errors.New("jobs: invalid rate")

// Limiter is a named, fleet-wide limit on the runs of the jobs that use it
// (Job.Limiters): the calls a remote store accepts, shared by every job
// that talks to it (docs/flow-control.md). Its state lives in Redis in a
// hash slot of its own, "{<prefix>:limiter:<name>}".
type Limiter struct {
	// Name, ^[a-z][a-z0-9_-]{0,63}$.
	Name string
	// Concurrency: at most this many runs holding the limiter execute at
	// once across every runner; 0 means no concurrency cap. A slot is a
	// lease: renewed by the run's heartbeat, released by its finish,
	// expired with its lease.
	Concurrency int
	// Rate paces the starts of the runs that use the limiter (GCRA); the
	// zero Rate means none.
	Rate Rate
	// HoldOnRetryAfter: when a run of a job using the limiter is told to
	// retry after d (RetryAfter, HTTP 429/503), the limiter starts nothing
	// for d: the remote told everyone to slow down.
	HoldOnRetryAfter bool
}

// Rate is a start rate: Count starts per Per, and up to Burst at once
// (default 1). Over any window of length W at most Count·W/Per + Burst
// starts happen.
type Rate struct {
	Count int
	Per   time.Duration
	Burst int
}

// IsZero reports whether r sets no rate.
func (r Rate) IsZero() bool { return r.Count == 0 }

// String formats r as ParseRate reads it ("20/s"), without the burst.
func (r Rate) String() string {
	if r.IsZero() {
		return ""
	}
	unit := map[time.Duration]string{time.Second: "s", time.Minute: "m", time.Hour: "h"}[r.Per]
	return strconv.Itoa(r.Count) + "/" + unit
}

// interval is the time between two starts at the rate.
func (r Rate) interval() time.Duration { return r.Per / time.Duration(r.Count) }

// rateCountMax bounds a rate's count: a start at most every microsecond.
const rateCountMax = 1_000_000

// ParseRate reads "N/s", "N/m" or "N/h" (N in 1..1,000,000 per second of
// the unit); "" is no rate. The burst is set apart (Rate.Burst).
func ParseRate(s string) (Rate, error) {
	if s == "" {
		return Rate{}, nil
	}
	n, unit, ok := strings.Cut(s, "/")
	per := map[string]time.Duration{"s": time.Second, "m": time.Minute, "h": time.Hour}[unit]
	count, err := strconv.Atoi(n)
	if !ok || per == 0 || err != nil || count < 1 || n != strconv.Itoa(count) || count > rateCountMax*int(per/time.Second) {
		return Rate{}, fmt.Errorf("%w: %q (want N/s, N/m or N/h, e.g. 20/s)", ErrInvalidRate, s)
	}
	return Rate{Count: count, Per: per}, nil
}

// FairnessBy names how a job's runs are grouped for fair share.
type FairnessBy string

// Fair-share groupings (Job.Fairness).
const (
	// FairnessSubjectPrefix groups runs by their subject up to the first
	// Separator ("acme:u42" is in group "acme").
	FairnessSubjectPrefix FairnessBy = "subjectPrefix"
	// FairnessRequest groups runs by the group of the request that created
	// them (SubmitOptions.Group).
	FairnessRequest FairnessBy = "request"
)

// Fairness groups a job's runs: while runs wait for a limiter the groups
// take turns, so a group's next run starts after at most one start of
// each other waiting group, however deep another group's backlog.
type Fairness struct {
	GroupBy FairnessBy
	// Separator of FairnessSubjectPrefix (default ":").
	Separator string
}

// LimiterNamePattern is what a limiter's name must match.
const LimiterNamePattern = `^[a-z][a-z0-9_-]{0,63}$`

// limiterNameRE is compiled on first use: a bounded repetition compiles to
// a long program, and every exec stage's supervisor starts this binary.
var limiterNameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(LimiterNamePattern) })

// ValidLimiterName reports whether name matches LimiterNamePattern.
func ValidLimiterName(name string) bool { return limiterNameRE().MatchString(name) }

// BurstMax bounds a rate's burst.
const BurstMax = 1_000_000

// ConcurrencyMax bounds a limiter's concurrency.
const ConcurrencyMax = 100_000

func (l *Limiter) validate() error {
	if !ValidLimiterName(l.Name) {
		return fmt.Errorf("%w: limiter name %q: want %s", ErrConfig, l.Name, LimiterNamePattern)
	}
	return validateLimits("limiter "+l.Name, l.Concurrency, &l.Rate)
}

func validateLimits(what string, concurrency int, r *Rate) error {
	if concurrency < 0 || concurrency > ConcurrencyMax {
		return fmt.Errorf("%w: %s: concurrency %d (want 0..%d)", ErrConfig, what, concurrency, ConcurrencyMax)
	}
	if r.IsZero() {
		if r.Burst != 0 || r.Per != 0 {
			return fmt.Errorf("%w: %s: a burst needs a rate", ErrConfig, what)
		}
		return nil
	}
	if _, err := ParseRate(r.String()); err != nil || r.String() == "" {
		return fmt.Errorf("%w: %s: rate %d per %s (want N/s, N/m or N/h)", ErrConfig, what, r.Count, r.Per)
	}
	if r.Burst == 0 {
		r.Burst = 1
	}
	if r.Burst < 1 || r.Burst > BurstMax {
		return fmt.Errorf("%w: %s: burst %d (want 1..%d)", ErrConfig, what, r.Burst, BurstMax)
	}
	return nil
}

// limiterDef is a limiter as a registry uses it: its key and the
// configuration its scripts take.
type limiterDef struct {
	Limiter
	key  string // its hash, "{<prefix>:limiter:<name>}"
	conf string // lib/limiters.lua lim_open
	// slotTTL: a slot reserved or taken lasts this long unless renewed —
	// the shortest lease TTL of the jobs that use it here, so every
	// holder's heartbeat comes in time.
	slotTTL time.Duration
	// hold: the limiter holds its starts on a retry-after.
	hold bool
}

// ownLimiterName names a job's own limiter (Job.Concurrency, Job.Rate);
// the dot keeps it apart from named limiters.
func ownLimiterName(scope string) string { return "job." + scope }

func newLimiterDef(prefix string, l Limiter) *limiterDef {
	interval := "0"
	if !l.Rate.IsZero() {
		interval = strconv.FormatFloat(float64(l.Rate.interval())/float64(time.Millisecond), 'f', 3, 64)
	}
	return &limiterDef{Limiter: l, key: "{" + prefix + ":limiter:" + l.Name + "}",
		conf: strconv.Itoa(l.Concurrency) + "," + interval + "," + strconv.Itoa(max(l.Rate.Burst, 1)), hold: l.HoldOnRetryAfter}
}

// groupOf returns the fair-share group of a run of job for subject (the
// request's group is read separately: FairnessRequest).
func (j *Job) groupOf(subject string) string {
	if j.Fairness.GroupBy != FairnessSubjectPrefix {
		return ""
	}
	g, _, _ := strings.Cut(subject, j.Fairness.Separator)
	return g
}

// buildLimiters validates the named limiters and the jobs' use of them,
// and makes each limited job's list (its own limiter first).
func (r *Registry) buildLimiters(named []Limiter) error {
	r.limiters = map[string]*limiterDef{}
	r.jobLimits = map[string][]*limiterDef{}
	for _, l := range named {
		if err := l.validate(); err != nil {
			return err
		}
		if _, dup := r.limiters[l.Name]; dup {
			return fmt.Errorf("%w: duplicate limiter %s", ErrConfig, l.Name)
		}
		if l.Concurrency == 0 && l.Rate.IsZero() {
			return fmt.Errorf("%w: limiter %s: sets neither concurrency nor rate", ErrConfig, l.Name)
		}
		r.limiters[l.Name] = newLimiterDef(r.ks.Prefix(), l)
	}
	for _, scope := range r.scopes {
		j := r.jobs[scope]
		if !j.limited() {
			continue
		}
		var defs []*limiterDef
		if j.Concurrency > 0 || !j.Rate.IsZero() {
			d := newLimiterDef(r.ks.Prefix(), Limiter{Name: ownLimiterName(scope), Concurrency: j.Concurrency, Rate: j.Rate})
			r.limiters[d.Name] = d
			defs = append(defs, d)
		}
		for _, name := range j.Limiters {
			d := r.limiters[name]
			if d == nil || strings.HasPrefix(name, "job.") {
				return fmt.Errorf("%w: job %s: unknown limiter %q", ErrConfig, scope, name)
			}
			for _, have := range defs {
				if have == d {
					return fmt.Errorf("%w: job %s: limiter %s listed twice", ErrConfig, scope, name)
				}
			}
			defs = append(defs, d)
		}
		r.jobLimits[scope] = defs
	}
	// a slot lasts the shortest lease TTL of the jobs using it (0: the
	// runner's, set by the runner: limiterDef.ttl)
	for scope, defs := range r.jobLimits {
		for _, d := range defs {
			if t := r.jobs[scope].LeaseTTL; t > 0 && (d.slotTTL == 0 || t < d.slotTTL) {
				d.slotTTL = t
			}
		}
	}
	return nil
}
