package jobs

import (
	"strconv"
	"strings"
	"time"

	"github.com/tasklease/tasklease/checkpoints"
	"github.com/tasklease/tasklease/taskkey"
)

// TaskView is what users see of a task: "already running, started 14:03,
// stage pushing". Field names are the HTTP API's (docs/http-api.md). Times are
// Redis time, RFC 3339 UTC; nil when not set.
type TaskView struct {
	// Key is the task key, "<subject>|<scope>"; Subject and Scope are its
	// parts.
	Key     string `json:"key"`
	Subject string `json:"subject"`
	Scope   string `json:"scope"`
	// RunID is the current (or last) run; "" when the task is idle.
	RunID string `json:"runId"`
	// Status is the run's status; StatusIdle when there is none.
	Status Status `json:"status"`
	// Stage is the stage the run is at ("" before its first attempt and
	// once it ended); Stages are all of the run's stages in order, and
	// CompletedStages the leading ones done.
	Stage           string   `json:"stage"`
	Stages          []string `json:"stages"`
	CompletedStages []string `json:"completedStages"`
	// Attempt is the current attempt, from 1 (0 until the first starts);
	// MaxAttempts is the run's limit (the job's RetryPolicy).
	Attempt     int `json:"attempt"`
	MaxAttempts int `json:"maxAttempts"`
	// Sources are the sources of the requests the run serves, each once.
	Sources []Source `json:"sources"`
	// Owner is the lease owner (Runner.Owner) of the latest attempt, and
	// FencingToken its fencing token; "" and 0 until the first attempt.
	Owner        string `json:"owner"`
	FencingToken int64  `json:"fencingToken"`
	// RequestedAt is the run's first request; StartedAt the start of its
	// first attempt; UpdatedAt its latest change; FinishedAt its end (done,
	// failed or cancelled); NextAttemptAt, while retrying, when the next
	// attempt is due.
	RequestedAt   *time.Time `json:"requestedAt"`
	StartedAt     *time.Time `json:"startedAt"`
	UpdatedAt     *time.Time `json:"updatedAt"`
	FinishedAt    *time.Time `json:"finishedAt"`
	NextAttemptAt *time.Time `json:"nextAttemptAt"`
	// LastError is the error of the run's latest failed attempt, or why it
	// failed; a run that ends done clears it.
	LastError string `json:"lastError"`
	// CanCancel: the run is active and no cancel was requested yet.
	CanCancel bool `json:"canCancel"`
	// CancelRequested: a cancel was requested; the holder is stopping the
	// run.
	CancelRequested bool `json:"cancelRequested"`
	// FollowUpQueued: a queue or replace request is waiting for this run
	// to end; its follow-up run starts then.
	FollowUpQueued bool `json:"followUpQueued"`
	// Waiting says why a queued run is not being claimed, e.g. during a
	// rolling deploy "waiting for a runner that defines stage pushing
	// (pod-a/1f2e3d does not)"; empty otherwise.
	Waiting string `json:"waiting,omitempty"`
	// NotBefore: a delayed run (SubmitOptions.Delay) is not started before
	// this time; nil otherwise.
	NotBefore *time.Time `json:"notBefore,omitempty"`
}

// delayedPrefix starts the record's 'waiting' of a delayed run, followed
// by the time in unix ms (lua/lib/runs.lua new_run).
const delayedPrefix = "notBefore "

// viewFromRecord builds a TaskView from a run record's fields (an HGETALL,
// or the JSON object scripts publish).
func viewFromRecord(f map[string]string) TaskView {
	var vals [len(viewFieldNames)]string
	for i, name := range viewFieldNames {
		vals[i] = f[name]
	}
	subject, scope := f["subject"], f["scope"]
	if subject == "" { // records keep only the key
		subject, scope, _ = strings.Cut(f["key"], taskkey.Separator)
	}
	return viewFromValues(f["key"], subject, scope, vals[:])
}

// Positions of the view fields in viewFieldNames (VIEW_FIELDS in
// lua/lib/submitting.lua), so a reply is read without a map.
const (
	vfRunID = iota
	vfStatus
	vfStage
	vfStages
	vfDone
	vfAttempt
	vfMaxAttempts
	vfSources
	vfOwner
	vfToken
	vfRequestedAt
	vfStartedAt
	vfUpdatedAt
	vfFinishedAt
	vfNextAttemptAt
	vfLastError
	vfCancel
	vfFollowUp
	vfWaiting
	vfCount
)

// viewFieldNames are the record fields a TaskView shows, in the order of
// VIEW_FIELDS in lua/lib/submitting.lua: submit.lua replies with their values only
// (viewFromReply).
var viewFieldNames = [vfCount]string{"runId", "status", "stage", "stages", "done", "attempt", "maxAttempts", "sources",
	"owner", "token", "requestedAt", "startedAt", "updatedAt", "finishedAt", "nextAttemptAt", "lastError",
	"cancel", "followUp", "waiting"}

// viewFromValues builds a TaskView from the values of viewFieldNames
// (missing trailing values read as empty).
func viewFromValues(key, subject, scope string, vals []string) TaskView {
	get := func(i int) string {
		if i < len(vals) {
			return vals[i]
		}
		return ""
	}
	v := TaskView{
		Key:             key,
		Subject:         subject,
		Scope:           scope,
		RunID:           get(vfRunID),
		Status:          Status(get(vfStatus)),
		Stage:           get(vfStage),
		Stages:          splitList(get(vfStages)),
		Owner:           get(vfOwner),
		LastError:       get(vfLastError),
		CancelRequested: get(vfCancel) == "1",
		FollowUpQueued:  get(vfFollowUp) == "1",
		Waiting:         get(vfWaiting),
		RequestedAt:     timeField(get(vfRequestedAt)),
		StartedAt:       timeField(get(vfStartedAt)),
		UpdatedAt:       timeField(checkpoints.LatestMillis(get(vfUpdatedAt), get(vfRequestedAt), get(vfStartedAt), get(vfFinishedAt))),
		FinishedAt:      timeField(get(vfFinishedAt)),
		NextAttemptAt:   timeField(get(vfNextAttemptAt)),
	}
	if ms, ok := strings.CutPrefix(v.Waiting, delayedPrefix); ok {
		if v.NotBefore = timeField(ms); v.NotBefore != nil {
			v.Waiting = "delayed: not started before " + v.NotBefore.Format(time.RFC3339)
		}
	}
	if v.Status == "" {
		v.Status = StatusIdle
	}
	v.Attempt = intField(get(vfAttempt))
	v.MaxAttempts = intField(get(vfMaxAttempts))
	if v.Attempt > 0 { // 'token' is also the key's fencing counter: a new run shows none yet
		v.FencingToken, _ = strconv.ParseInt(get(vfToken), 10, 64)
	}
	done := intField(get(vfDone))
	v.CompletedStages = v.Stages[:min(max(done, 0), len(v.Stages))]
	srcs := splitList(get(vfSources))
	v.Sources = make([]Source, len(srcs))
	for i, s := range srcs {
		v.Sources[i] = Source(s)
	}
	v.CanCancel = v.Status.Active() && !v.CancelRequested
	return v
}

func idleView(key, subject, scope string, stages []string) TaskView {
	return TaskView{Key: key, Subject: subject, Scope: scope, Status: StatusIdle,
		Stages: stages, CompletedStages: []string{}, Sources: []Source{}}
}

func splitList(s string) []string {
	if s == "" {
		return []string{}
	}
	return strings.Split(s, ",")
}

// intField reads a counter field; an absent one ("", a new run's done and
// attempt) is 0 without the error value strconv would allocate.
func intField(s string) int {
	if s == "" {
		return 0
	}
	n, _ := strconv.Atoi(s)
	return n
}

func timeField(s string) *time.Time {
	if s == "" {
		return nil
	}
	t := checkpoints.MillisTime(s)
	if t.IsZero() {
		return nil
	}
	return &t
}

// Event is one entry of a task's history (docs/operations.md), newest first in
// History. Event names: requested, joined, skipped, throttled, started,
// stage, progress, retry-scheduled, recovered, lease-lost, handed-back,
// cancelled, done, failed.
type Event struct {
	At time.Time `json:"at"` // Redis time
	// Count is how many identical requests (same run, source and outcome)
	// this event stands for: repeats are coalesced into the first one
	// (docs/policies.md). LastAt is the time of the last of them.
	Count  int        `json:"count"`
	LastAt *time.Time `json:"lastAt,omitempty"`
	// RunID is the run the event belongs to (for a queue or replace
	// request, the follow-up that serves it).
	RunID string `json:"runId"`
	// Event is the event's name, e.g. "requested" or "stage".
	Event string `json:"event"`
	// Source is a request's source (for started and recovered, that of the
	// request claimed); Stage is the stage the event concerns.
	Source string `json:"source"`
	Stage  string `json:"stage"`
	// Outcome qualifies the event, e.g. a request's Outcome, "done" for a
	// completed stage, "attempt 1 of 3" for a scheduled retry.
	Outcome string `json:"outcome"`
	// Error is the event's error: why an attempt was retried, or why the
	// run failed or was cancelled.
	Error string `json:"error"`
	// Owner and FencingToken are those of the lease holder that wrote the
	// event (empty and 0 when none did, e.g. for a request).
	Owner        string `json:"owner"`
	FencingToken int64  `json:"fencingToken"`
}

func eventFromFields(f map[string]any) Event {
	str := func(k string) string { s, _ := f[k].(string); return s }
	e := Event{
		At:      checkpoints.MillisTime(str("at")),
		RunID:   str("runId"),
		Event:   str("event"),
		Source:  str("source"),
		Stage:   str("stage"),
		Outcome: str("outcome"),
		Error:   str("error"),
		Owner:   str("owner"),
		Count:   1,
	}
	e.FencingToken, _ = strconv.ParseInt(str("fencingToken"), 10, 64)
	return e
}
