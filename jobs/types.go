package jobs

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/tasklease/tasklease/checkpoints"
	"github.com/tasklease/tasklease/taskkey"
)

// Sentinel errors; test with errors.Is.
var (
	// ErrUnknownScope: no job is registered for the scope.
	ErrUnknownScope = errors.New("jobs: unknown scope")
	// ErrInvalidSource: the source is not schedule, foreground, manual or retry.
	ErrInvalidSource = errors.New("jobs: invalid source")
	// ErrInvalidPolicy: the policy is not join, skip, queue or replace.
	ErrInvalidPolicy = errors.New("jobs: invalid policy")
	// ErrInvalidDelay: a submit's delay is negative or too long.
	ErrInvalidDelay = errors.New("jobs: invalid delay")
	// ErrInvalidStatus: not a run status (List filters).
	ErrInvalidStatus = errors.New("jobs: invalid status")
	// ErrNotFound: the task key has no run record.
	ErrNotFound = errors.New("jobs: task not found")
	// ErrConfig: invalid job or runner configuration.
	ErrConfig = errors.New("jobs: invalid config")
	// ErrCancelled is the cause of a stage context cancelled through the
	// registry.
	ErrCancelled = errors.New("jobs: run cancelled")
	// ErrShutdown is the cause of a stage context cancelled because the
	// runner shuts down; the run is handed back, not failed.
	ErrShutdown = errors.New("jobs: runner shutting down")
	// ErrStaleToken: a downstream system rejected the fencing token (HTTP
	// 409). The run stops as failed without retrying: a newer holder exists.
	ErrStaleToken = errors.New("jobs: fencing token rejected as stale")
	// ErrPermanent marks a stage error that must not be retried; wrap it
	// with Permanent.
	ErrPermanent = errors.New("jobs: permanent failure")
)

// Permanent wraps err so the run fails at once instead of retrying.
func Permanent(err error) error { return fmt.Errorf("%w: %w", ErrPermanent, err) }

// Source says why a run was requested. It is recorded for audit and
// metrics and never takes part in deduplication.
type Source string

// Sources (docs/concepts.md).
const (
	SourceSchedule   Source = "schedule"   // a cron schedule
	SourceForeground Source = "foreground" // the app came to the foreground
	SourceManual     Source = "manual"     // a person asked ("sync now")
	SourceRetry      Source = "retry"      // the retry queue
)

// ParseSource validates s.
func ParseSource(s string) (Source, error) {
	switch Source(s) {
	case SourceSchedule, SourceForeground, SourceManual, SourceRetry:
		return Source(s), nil
	}
	return "", fmt.Errorf("%w: %q (want schedule, foreground, manual or retry)", ErrInvalidSource, s)
}

// Policy decides what a request does when its key already has an active
// (queued, running or retrying) run.
type Policy string

// Conflict policies (docs/policies.md).
const (
	// PolicyJoin merges the request into the active run and returns its view.
	PolicyJoin Policy = "join"
	// PolicySkip drops the request (recorded in history).
	PolicySkip Policy = "skip"
	// PolicyQueue runs at most one follow-up after the active run; many
	// queue requests coalesce into that one follow-up.
	PolicyQueue Policy = "queue"
	// PolicyReplace cancels the active run; a fresh run follows.
	PolicyReplace Policy = "replace"
)

// ParsePolicy validates s.
func ParsePolicy(s string) (Policy, error) {
	switch Policy(s) {
	case PolicyJoin, PolicySkip, PolicyQueue, PolicyReplace:
		return Policy(s), nil
	}
	return "", fmt.Errorf("%w: %q (want join, skip, queue or replace)", ErrInvalidPolicy, s)
}

// Outcome is what Submit did with a request.
type Outcome string

// Submit outcomes (docs/policies.md).
const (
	OutcomeStarted   Outcome = "started"   // a new run was created
	OutcomeJoined    Outcome = "joined"    // merged into the active run
	OutcomeQueued    Outcome = "queued"    // a follow-up run will follow the active one
	OutcomeSkipped   Outcome = "skipped"   // dropped by the skip policy
	OutcomeReplaced  Outcome = "replaced"  // the active run is cancelled, a fresh one follows
	OutcomeThrottled Outcome = "throttled" // within minInterval of the last success
)

// Status of a task's current (or last) run.
type Status string

// Run statuses (docs/http-api.md).
const (
	StatusIdle      Status = "idle"      // no run recorded (never requested, or its record expired)
	StatusQueued    Status = "queued"    // requested, waiting for a runner (or parked by a pause)
	StatusRunning   Status = "running"   // a runner holds the lease and executes it
	StatusRetrying  Status = "retrying"  // an attempt failed; the next waits for its backoff
	StatusDone      Status = "done"      // every stage completed
	StatusFailed    Status = "failed"    // a permanent error or the last attempt failed
	StatusCancelled Status = "cancelled" // cancelled before it ended
)

// Active reports whether a run in this status blocks a new one.
func (s Status) Active() bool {
	return s == StatusQueued || s == StatusRunning || s == StatusRetrying
}

// ParseStatus validates s.
func ParseStatus(s string) (Status, error) {
	switch st := Status(s); st {
	case StatusIdle, StatusQueued, StatusRunning, StatusRetrying, StatusDone, StatusFailed, StatusCancelled:
		return st, nil
	}
	return "", fmt.Errorf("%w: %q (want idle, queued, running, retrying, done, failed or cancelled)", ErrInvalidStatus, s)
}

// Handler executes one stage of a run. It must return when ctx is done: ctx
// is cancelled on lease loss, cancel, stage timeout and shutdown
// (context.Cause tells which). A nil error completes the stage.
type Handler interface {
	// RunStage does the stage's work for run.
	RunStage(ctx context.Context, run *Run) error
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, run *Run) error

// RunStage calls f.
func (f HandlerFunc) RunStage(ctx context.Context, run *Run) error { return f(ctx, run) }

// Stage is one named step of a job.
type Stage struct {
	// Name, e.g. "pulling"; ^[a-z][a-z0-9_-]{0,63}$.
	Name string
	// Timeout bounds one execution of the stage; 0 means none.
	Timeout time.Duration
	// Handler does the work.
	Handler Handler
}

// Retry defaults: the values a zero RetryPolicy field takes.
const (
	MaxAttemptsDefault = 3               // RetryPolicy.MaxAttempts
	BackoffDefault     = time.Second     // RetryPolicy.Backoff
	MaxBackoffDefault  = 5 * time.Minute // RetryPolicy.MaxBackoff
)

// RetryPolicy bounds and spaces the attempts of a run.
type RetryPolicy struct {
	// MaxAttempts counts every attempt, including the first and those ended
	// by a crash (default MaxAttemptsDefault). 1 disables retries.
	MaxAttempts int
	// Backoff is the delay before the second attempt; it doubles for each
	// later one, with jitter (default BackoffDefault).
	Backoff time.Duration
	// MaxBackoff caps the delay (default MaxBackoffDefault).
	MaxBackoff time.Duration
}

// Job is the definition of one scope: its ordered stages and policies.
type Job struct {
	// Scope, e.g. "course_sync"; ^[a-z][a-z0-9_]{0,63}$.
	Scope string
	// Stages run in order; a finished stage is never re-run within a run.
	Stages []Stage
	// OnConflict is the default policy for requests that find an active run
	// (default PolicyJoin).
	OnConflict Policy
	// MinInterval throttles schedule and foreground requests arriving less
	// than this after the last successful finish. Manual requests are never
	// throttled.
	MinInterval time.Duration
	// Debounce gives every request but a manual one a delay of Debounce
	// (SubmitOptions.Delay) when it sets none, and each later such request
	// that joins the still delayed run moves its start to now + Debounce,
	// never past its first request + DebounceMax: a burst of foreground
	// webhooks becomes one run, started once the burst is over. A person's
	// request starts it at once. Default 0: off.
	Debounce time.Duration
	// DebounceMax bounds how long a debounced run waits after its first
	// request (default DebounceMaxDefault; at least Debounce).
	DebounceMax time.Duration
	// Retry policy of failed attempts.
	Retry RetryPolicy
	// LeaseTTL overrides the runner's lease TTL for this job.
	LeaseTTL time.Duration
	// Foreground: requests from the foreground hook without explicit scopes
	// submit this job.
	Foreground bool
	// Limiters names the fleet-wide limiters (Config.Limiters) a run of
	// this job holds while it executes: jobs calling the same remote store
	// share one.
	Limiters []string
	// Concurrency caps this job's runs executing at once across the fleet;
	// Rate paces their starts. Together they are a limiter of the job's
	// own, named "job.<scope>". 0 and the zero Rate: none.
	Concurrency int
	Rate        Rate
	// Fairness groups the job's runs for fair share while they wait for a
	// limiter; the zero value puts them all in one group (oldest first).
	Fairness Fairness
}

// limited reports whether the job's runs take limiter slots.
func (j *Job) limited() bool { return len(j.Limiters) > 0 || j.Concurrency > 0 || !j.Rate.IsZero() }

// StageNames returns the job's stage names in order.
func (j *Job) StageNames() []string {
	out := make([]string, len(j.Stages))
	for i, s := range j.Stages {
		out[i] = s.Name
	}
	return out
}

// normalize applies defaults and validates the job.
func (j *Job) normalize() error {
	if err := taskkey.ValidateScope(j.Scope); err != nil {
		return fmt.Errorf("%w: job scope: %w", ErrConfig, err)
	}
	if err := checkpoints.ValidateStages(j.StageNames()); err != nil {
		return fmt.Errorf("%w: job %s: %w", ErrConfig, j.Scope, err)
	}
	for _, s := range j.Stages {
		if s.Handler == nil {
			return fmt.Errorf("%w: job %s stage %s: nil handler", ErrConfig, j.Scope, s.Name)
		}
		if s.Timeout < 0 {
			return fmt.Errorf("%w: job %s stage %s: negative timeout", ErrConfig, j.Scope, s.Name)
		}
	}
	if j.OnConflict == "" {
		j.OnConflict = PolicyJoin
	}
	if _, err := ParsePolicy(string(j.OnConflict)); err != nil {
		return fmt.Errorf("job %s: %w", j.Scope, err)
	}
	if j.MinInterval < 0 || j.LeaseTTL < 0 || j.Debounce < 0 || j.DebounceMax < 0 {
		return fmt.Errorf("%w: job %s: negative duration", ErrConfig, j.Scope)
	}
	if j.Debounce > 0 && j.DebounceMax == 0 {
		j.DebounceMax = max(DebounceMaxDefault, j.Debounce)
	}
	if j.Debounce > DelayMax || j.DebounceMax > DelayMax || (j.Debounce > 0 && j.DebounceMax < j.Debounce) {
		return fmt.Errorf("%w: job %s: debounce %s, debounceMax %s: want debounce <= debounceMax <= %s",
			ErrConfig, j.Scope, j.Debounce, j.DebounceMax, DelayMax)
	}
	if err := validateLimits("job "+j.Scope, j.Concurrency, &j.Rate); err != nil {
		return err
	}
	switch j.Fairness.GroupBy {
	case "", FairnessRequest:
	case FairnessSubjectPrefix:
		if j.Fairness.Separator == "" {
			j.Fairness.Separator = ":"
		}
	default:
		return fmt.Errorf("%w: job %s: fairness groupBy %q (want subjectPrefix or request)", ErrConfig, j.Scope, j.Fairness.GroupBy)
	}
	r := &j.Retry
	if r.MaxAttempts == 0 {
		r.MaxAttempts = MaxAttemptsDefault
	}
	if r.Backoff == 0 {
		r.Backoff = BackoffDefault
	}
	if r.MaxBackoff == 0 {
		r.MaxBackoff = MaxBackoffDefault
	}
	if r.MaxAttempts < 1 || r.Backoff < 0 || r.MaxBackoff < r.Backoff {
		return fmt.Errorf("%w: job %s: retry needs maxAttempts >= 1 and 0 <= backoff <= maxBackoff", ErrConfig, j.Scope)
	}
	return nil
}
