package triggers

import (
	"context"
	"errors"
	"fmt"

	"github.com/tasklease/tasklease/jobs"
	"github.com/tasklease/tasklease/taskkey"
)

// ForegroundResult is the registry's answer for one scope of a foreground
// request.
type ForegroundResult struct {
	// Scope is the job the request was submitted for.
	Scope string `json:"scope"`
	// Outcome is what the registry did with it (started, joined, ...).
	Outcome jobs.Outcome `json:"outcome"`
	// RunID is the run that serves the request (jobs.SubmitResult.RunID):
	// for queued and replaced, the follow-up; empty when skipped or
	// throttled.
	RunID string `json:"runId,omitempty"`
	// Task is the task's view after the request, e.g. the running run it
	// joined.
	Task jobs.TaskView `json:"task"`
}

// Foreground submits subject's foreground request for scopes (or for every
// job with Foreground true when scopes is empty), with source "foreground"
// and each job's default conflict policy; a scope listed twice is submitted
// once. It validates everything before submitting anything: an invalid
// subject or scope (taskkey.ErrInvalid) or any unknown scope (jobs.ErrUnknownScope)
// submits nothing. Results are in the order of scopes (sorted when scopes is
// empty; empty, not nil, when no job is a foreground job). If Redis fails
// part-way, the results submitted so far are returned with the error.
func Foreground(ctx context.Context, reg *jobs.Registry, subject string, scopes []string) ([]ForegroundResult, error) {
	if reg == nil {
		return nil, fmt.Errorf("%w: nil registry", jobs.ErrConfig)
	}
	if err := taskkey.ValidateSubject(subject); err != nil {
		return nil, err
	}
	var todo []string
	if len(scopes) == 0 {
		for _, sc := range reg.Scopes() {
			if j, _ := reg.Job(sc); j.Foreground {
				todo = append(todo, sc)
			}
		}
	} else {
		var errs []error
		seen := make(map[string]bool, len(scopes))
		for _, sc := range scopes {
			if err := taskkey.ValidateScope(sc); err != nil {
				errs = append(errs, err)
				continue
			}
			if _, ok := reg.Job(sc); !ok {
				errs = append(errs, fmt.Errorf("%w: %q", jobs.ErrUnknownScope, sc))
				continue
			}
			if !seen[sc] {
				seen[sc] = true
				todo = append(todo, sc)
			}
		}
		if err := errors.Join(errs...); err != nil {
			return nil, err
		}
	}
	out := make([]ForegroundResult, 0, len(todo))
	for _, sc := range todo {
		res, err := reg.Submit(ctx, subject, sc, jobs.SubmitOptions{Source: jobs.SourceForeground})
		if err != nil {
			return out, err
		}
		out = append(out, ForegroundResult{Scope: sc, Outcome: res.Outcome, RunID: res.RunID, Task: res.Task})
	}
	return out, nil
}
