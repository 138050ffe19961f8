package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/tasklease/tasklease/jobs"
	"github.com/tasklease/tasklease/triggers"
)

// maxLimit bounds ?limit= on list and history (jobs.ListLimitMax).
const maxLimit = jobs.ListLimitMax

// submitBody is the body of POST /v1/tasks/{subject}/{scope}/runs. Both
// fields are optional: source defaults to manual, policy to the job's.
type submitBody struct {
	Source string `json:"source"`
	Policy string `json:"policy"`
	// Delay (a Go duration, "90s") and NotBefore (RFC 3339) delay the run
	// the request starts (jobs.SubmitOptions).
	Delay     string `json:"delay"`
	NotBefore string `json:"notBefore"`
	// Group is the fair-share group of the run the request starts, for a
	// job whose fairness groups by request (jobs.SubmitOptions.Group).
	Group string `json:"group"`
}

// options validates the body's delay fields and returns the submit's
// options.
func (b submitBody) options() (jobs.SubmitOptions, error) {
	o := jobs.SubmitOptions{Source: jobs.Source(b.Source), Policy: jobs.Policy(b.Policy), Group: b.Group}
	if b.Delay != "" {
		d, err := time.ParseDuration(b.Delay)
		if err != nil || d < 0 || d > jobs.DelayMax {
			return o, badRequestf("invalid delay %q (want a duration such as 90s, at most %s)", b.Delay, jobs.DelayMax)
		}
		o.Delay = d
	}
	if b.NotBefore != "" {
		t, err := time.Parse(time.RFC3339, b.NotBefore)
		if err != nil {
			return o, badRequestf("invalid notBefore %q (want RFC 3339, e.g. 2026-12-03T14:05:00Z)", b.NotBefore)
		}
		o.NotBefore = t
	}
	return o, nil
}

// submitResponse is jobs.SubmitResult on the wire; declared here so the
// contract's field names are visible next to the route.
type submitResponse struct {
	Outcome jobs.Outcome  `json:"outcome"`
	RunID   string        `json:"runId,omitempty"`
	Task    jobs.TaskView `json:"task"`
}

func (a *api) submit(w http.ResponseWriter, r *http.Request) {
	var body submitBody
	if _, err := a.decode(w, r, &body); err != nil {
		a.fail(w, r, err)
		return
	}
	opts, err := body.options()
	if err != nil {
		a.fail(w, r, err)
		return
	}
	res, err := a.reg.Submit(r.Context(), r.PathValue("subject"), r.PathValue("scope"), opts)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	// 200 for every outcome, "started" included: the outcome field says
	// what happened, so clients handle one success shape.
	writeJSON(w, http.StatusOK, submitResponse{Outcome: res.Outcome, RunID: res.RunID, Task: res.Task})
}

func (a *api) get(w http.ResponseWriter, r *http.Request) {
	v, err := a.reg.Get(r.Context(), r.PathValue("subject"), r.PathValue("scope"))
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

type cancelResponse struct {
	Outcome jobs.CancelOutcome `json:"outcome"`
}

func (a *api) cancel(w http.ResponseWriter, r *http.Request) {
	o, err := a.reg.Cancel(r.Context(), r.PathValue("subject"), r.PathValue("scope"))
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, cancelResponse{Outcome: o})
}

type historyResponse struct {
	Events []jobs.Event `json:"events"`
}

// history answers the key's events, newest first. A key that never ran has
// no events: that is an empty list, not 404, because history outlives the
// run record (and a client polling history should not special-case it).
func (a *api) history(w http.ResponseWriter, r *http.Request) {
	limit, err := parseLimit(r)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	ev, err := a.reg.History(r.Context(), r.PathValue("subject"), r.PathValue("scope"), limit)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	if ev == nil {
		ev = []jobs.Event{}
	}
	writeJSON(w, http.StatusOK, historyResponse{Events: ev})
}

type listResponse struct {
	Tasks []jobs.TaskView `json:"tasks"`
	// Total counts every task matching the filter; Offset and Limit are
	// the page's.
	Total     int  `json:"total"`
	Offset    int  `json:"offset"`
	Limit     int  `json:"limit"`
	Truncated bool `json:"truncated,omitempty"`
}

// list answers a page of the task table: ?status=&scope=&subject=
// &subjectPrefix=&sort=updated|started&limit=&offset=.
func (a *api) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit, err := parseLimit(r)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	opts, err := parseFilter(filterBody{Status: q.Get("status"), Scope: q.Get("scope"), Subject: q.Get("subject"), SubjectPrefix: q.Get("subjectPrefix")})
	if err != nil {
		a.fail(w, r, err)
		return
	}
	opts.Limit = limit
	if s := q.Get("offset"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 0 {
			a.fail(w, r, badRequestf("invalid offset %q (want 0 or more)", s))
			return
		}
		opts.Offset = n
	}
	if opts.Sort, err = jobs.ParseListSort(q.Get("sort")); err != nil {
		a.fail(w, r, badRequestf("invalid sort %q (want updated or started)", q.Get("sort")))
		return
	}
	page, err := a.reg.ListPage(r.Context(), opts)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, listResponse{Tasks: page.Tasks, Total: page.Total, Offset: page.Offset, Limit: page.Limit, Truncated: page.Truncated})
}

// foregroundBody is the body of POST /v1/hooks/foreground. Scopes omitted
// or empty: every job with Foreground set.
type foregroundBody struct {
	Subject string   `json:"subject"`
	Scopes  []string `json:"scopes"`
}

type foregroundResponse struct {
	Results []triggers.ForegroundResult `json:"results"`
}

// foreground is the app-came-to-the-foreground webhook. Every scope is
// validated before anything is submitted, so a bad request starts nothing.
func (a *api) foreground(w http.ResponseWriter, r *http.Request) {
	var body foregroundBody
	empty, err := a.decode(w, r, &body)
	if err == nil && empty {
		err = badRequestf(`body required: {"subject": "...", "scopes": [...]}`)
	}
	if err != nil {
		a.fail(w, r, err)
		return
	}
	if msg := foregroundRefusal(principalOf(r.Context()), body.Subject, body.Scopes); msg != "" {
		writeError(w, http.StatusForbidden, "forbidden", msg)
		return
	}
	results, err := triggers.Foreground(r.Context(), a.reg, body.Subject, body.Scopes)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	out := foregroundResponse{Results: results}
	writeJSON(w, http.StatusOK, out)
}

func (a *api) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (a *api) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), readyTimeout)
	defer cancel()
	if err := a.ready(ctx); err != nil {
		a.log.WarnContext(r.Context(), "http: not ready", "error", err)
		writeError(w, http.StatusServiceUnavailable, "unavailable", "not ready: redis unavailable")
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// decode reads a JSON object into dst, strictly: unknown fields, trailing
// data and wrong types are bad requests, an oversized body is
// *http.MaxBytesError. An empty (or all-whitespace) body leaves dst alone
// and reports empty, since every field of a submit is optional.
func (a *api) decode(w http.ResponseWriter, r *http.Request, dst any) (empty bool, err error) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, a.bodyLimit))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return false, err
		}
		return false, badRequestf("reading body: %v", err)
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return true, nil
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return false, badRequestf("invalid JSON body: %v", err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return false, badRequestf("invalid JSON body: data after the object")
	}
	return false, nil
}

// parseLimit reads ?limit=: absent means the registry's default; otherwise
// 1..maxLimit.
func parseLimit(r *http.Request) (int, error) {
	s := r.URL.Query().Get("limit")
	if s == "" {
		return 0, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > maxLimit {
		return 0, badRequestf("invalid limit %q (want 1..%d)", s, maxLimit)
	}
	return n, nil
}
