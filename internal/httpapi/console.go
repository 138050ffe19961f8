package httpapi

import (
	"net/http"

	"github.com/tasklease/tasklease/jobs"
	"github.com/tasklease/tasklease/taskkey"
	"github.com/tasklease/tasklease/triggers"
)

// The operator console's routes (docs/http-api.md): scopes and their pause,
// runners, limiters, schedules and cancel-all-matching.

// filterBody selects tasks: the query of GET /v1/tasks and the body of
// POST /v1/tasks/cancel.
type filterBody struct {
	Status        string `json:"status"`
	Scope         string `json:"scope"`
	Subject       string `json:"subject"`
	SubjectPrefix string `json:"subjectPrefix"`
	// DryRun (POST /v1/tasks/cancel only): count, cancel nothing.
	DryRun bool `json:"dryRun"`
}

// parseFilter validates a filter. A malformed scope is bad input (400); a
// well-formed unknown one is not found (404), as in the task routes.
func parseFilter(f filterBody) (jobs.ListOptions, error) {
	opts := jobs.ListOptions{Scope: f.Scope, Subject: f.Subject, SubjectPrefix: f.SubjectPrefix}
	// Validated here rather than left to the registry: jobs.ParseStatus
	// wraps jobs.ErrConfig, which is not an input error class this layer
	// can map.
	if f.Status != "" {
		st, err := jobs.ParseStatus(f.Status)
		if err != nil {
			return opts, badRequestf("invalid status %q (want idle, queued, running, retrying, done, failed or cancelled)", f.Status)
		}
		opts.Status = st
	}
	if f.Scope != "" {
		if err := taskkey.ValidateScope(f.Scope); err != nil {
			return opts, err
		}
	}
	if f.Subject != "" {
		if err := taskkey.ValidateSubject(f.Subject); err != nil {
			return opts, err
		}
	}
	if f.SubjectPrefix != "" {
		if err := taskkey.ValidateSubject(f.SubjectPrefix); err != nil {
			return opts, badRequestf("invalid subjectPrefix %q: %v", f.SubjectPrefix, err)
		}
	}
	return opts, nil
}

// cancelMatching cancels every active task matching the body's filter
// (or, with dryRun, counts them): the console's "cancel all matching".
// An empty filter matches every active task, so the body is required.
func (a *api) cancelMatching(w http.ResponseWriter, r *http.Request) {
	var body filterBody
	empty, err := a.decode(w, r, &body)
	if err == nil && empty {
		err = badRequestf(`body required: {"status": "", "scope": "", "subjectPrefix": "", "dryRun": true} ({} cancels every active task)`)
	}
	if err != nil {
		a.fail(w, r, err)
		return
	}
	opts, err := parseFilter(body)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	sum, err := a.reg.CancelMatching(r.Context(), opts, body.DryRun)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, sum)
}

func (a *api) scopes(w http.ResponseWriter, r *http.Request) {
	ov, err := a.reg.Overview(r.Context())
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, ov)
}

type pauseResponse struct {
	Scope  string `json:"scope"`
	Paused bool   `json:"paused"`
	// Requeued (resume only): the runs parked while paused, now queued.
	Requeued *int `json:"requeued,omitempty"`
}

func (a *api) pause(w http.ResponseWriter, r *http.Request) {
	scope := r.PathValue("scope")
	if err := taskkey.ValidateScope(scope); err != nil {
		a.fail(w, r, err)
		return
	}
	if err := a.reg.Pause(r.Context(), scope); err != nil {
		a.fail(w, r, err)
		return
	}
	a.log.InfoContext(r.Context(), "scope paused", "scope", scope)
	writeJSON(w, http.StatusOK, pauseResponse{Scope: scope, Paused: true})
}

func (a *api) resume(w http.ResponseWriter, r *http.Request) {
	scope := r.PathValue("scope")
	if err := taskkey.ValidateScope(scope); err != nil {
		a.fail(w, r, err)
		return
	}
	n, err := a.reg.Resume(r.Context(), scope)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	a.log.InfoContext(r.Context(), "scope resumed", "scope", scope, "requeued", n)
	writeJSON(w, http.StatusOK, pauseResponse{Scope: scope, Paused: false, Requeued: &n})
}

type runnersResponse struct {
	Runners []jobs.RunnerInfo `json:"runners"`
}

func (a *api) runners(w http.ResponseWriter, r *http.Request) {
	rs, err := a.reg.Runners(r.Context())
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, runnersResponse{Runners: rs})
}

type limitersResponse struct {
	Limiters []jobs.LimiterView `json:"limiters"`
}

// limiters answers every limiter's state: named ones and the jobs' own
// ("job.<scope>"), by name; an empty list when none is configured.
func (a *api) limiters(w http.ResponseWriter, r *http.Request) {
	ls, err := a.reg.Limiters(r.Context())
	if err != nil {
		a.fail(w, r, err)
		return
	}
	if ls == nil {
		ls = []jobs.LimiterView{}
	}
	writeJSON(w, http.StatusOK, limitersResponse{Limiters: ls})
}

type schedulesResponse struct {
	Schedules []triggers.ScheduleStatus `json:"schedules"`
}

func (a *api) schedules(w http.ResponseWriter, r *http.Request) {
	out := schedulesResponse{Schedules: []triggers.ScheduleStatus{}}
	if a.scheduleStatus != nil {
		st, err := a.scheduleStatus(r.Context())
		if err != nil {
			a.fail(w, r, err)
			return
		}
		out.Schedules = append(out.Schedules, st...)
	}
	writeJSON(w, http.StatusOK, out)
}
