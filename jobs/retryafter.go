package jobs

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Back-pressure bounds (RetryAfter).
const (
	// RetryAfterMax caps the delay a stage may ask for: a longer one (a
	// remote that answers "Retry-After: 86400") waits this long, and asks
	// again then.
	RetryAfterMax = time.Hour
	// RetryAfterExitCode is the exit status with which an exec stage asks
	// to be retried later without counting the attempt (EX_TEMPFAIL of
	// sysexits.h). The delay is the last line of its standard error that
	// reads "retry-after: <Go duration or seconds>"; without one, the
	// job's retry backoff.
	RetryAfterExitCode = 75
)

// RetryAfterError is the error of a stage that asked to be run again
// after Delay: the remote it talks to is overloaded or rate-limits it.
// See RetryAfter.
type RetryAfterError struct {
	// Delay is how long to wait before the stage runs again, at most
	// RetryAfterMax; 0 means the job's retry backoff.
	Delay time.Duration
	// Err is what the stage saw (kept as the run's last error).
	Err error
}

func (e *RetryAfterError) Error() string {
	if e.Delay > 0 {
		return fmt.Sprintf("retry after %s: %v", e.Delay, e.Err)
	}
	return fmt.Sprintf("retry later: %v", e.Err)
}

func (e *RetryAfterError) Unwrap() error { return e.Err }

// RetryAfter is the error a stage returns when the remote it talks to
// told it to slow down (an HTTP 429 or 503 with Retry-After, a quota
// error). The attempt is not counted against the job's maxAttempts: the
// run goes back to retrying, keeps its checkpoint, and resumes at this
// stage after d (the job's retry backoff when d is 0; at most
// RetryAfterMax). A cancel still ends it at once. HTTP stages return it
// for 429 and 503 answers that carry Retry-After, exec stages for exit
// status RetryAfterExitCode.
func RetryAfter(d time.Duration, err error) error {
	if err == nil {
		err = errors.New("the stage asked to be retried later")
	}
	return &RetryAfterError{Delay: min(max(d, 0), RetryAfterMax), Err: err}
}

// isRetryAfter reports whether err asks for a retry that does not count.
func isRetryAfter(err error) bool {
	_, ok := retryAfterOf(err)
	return ok
}

// retryAfterOf returns the RetryAfterError in err's chain, if any.
func retryAfterOf(err error) (*RetryAfterError, bool) {
	var ra *RetryAfterError
	ok := errors.As(err, &ra)
	return ra, ok
}

// parseRetryAfter reads an HTTP Retry-After value: delay-seconds or an
// HTTP-date (RFC 9110 §10.2.3), relative to now. ok is false when the value
// is neither.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		if n < 0 {
			return 0, false
		}
		return time.Duration(min(n, int64(RetryAfterMax/time.Second))) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(t.Sub(now), 0), true
}

// parseExecRetryAfter finds the delay an exec stage that exited with
// RetryAfterExitCode asked for: the last line of its standard error of the
// form "retry-after: 2s" (a Go duration, or whole seconds).
func parseExecRetryAfter(stderrTail string) time.Duration {
	lines := strings.Split(strings.TrimRight(stderrTail, "\n"), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		v, ok := strings.CutPrefix(strings.TrimSpace(lines[i]), "retry-after:")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		if d, err := time.ParseDuration(v); err == nil && d >= 0 {
			return d
		}
		if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 {
			return time.Duration(min(n, int64(RetryAfterMax/time.Second))) * time.Second
		}
		return 0
	}
	return 0
}
