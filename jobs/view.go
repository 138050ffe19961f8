package jobs

import (
	"strconv"
	"strings"
	"time"

	"github.com/tasklease/tasklease/checkpoints"
)

// TaskView is what users see of a task: "already running, started 14:03,
// stage pushing". Field names are the HTTP API's (DESIGN §5). Times are
// Redis time, RFC 3339 UTC; nil when not set.
type TaskView struct {
	Key             string     `json:"key"`
	Subject         string     `json:"subject"`
	Scope           string     `json:"scope"`
	RunID           string     `json:"runId"`
	Status          Status     `json:"status"`
	Stage           string     `json:"stage"`
	Stages          []string   `json:"stages"`
	CompletedStages []string   `json:"completedStages"`
	Attempt         int        `json:"attempt"`
	MaxAttempts     int        `json:"maxAttempts"`
	Sources         []Source   `json:"sources"`
	Owner           string     `json:"owner"`
	FencingToken    int64      `json:"fencingToken"`
	RequestedAt     *time.Time `json:"requestedAt"`
	StartedAt       *time.Time `json:"startedAt"`
	UpdatedAt       *time.Time `json:"updatedAt"`
	FinishedAt      *time.Time `json:"finishedAt"`
	NextAttemptAt   *time.Time `json:"nextAttemptAt"`
	LastError       string     `json:"lastError"`
	CanCancel       bool       `json:"canCancel"`
	CancelRequested bool       `json:"cancelRequested"`
	FollowUpQueued  bool       `json:"followUpQueued"`
	// Waiting says why a queued run is not being claimed, e.g. during a
	// rolling deploy "waiting for a runner that defines stage pushing
	// (pod-a/1f2e3d does not)"; empty otherwise.
	Waiting string `json:"waiting,omitempty"`
}

// viewFromRecord builds a TaskView from a run record's fields (an HGETALL,
// or the JSON object scripts publish).
func viewFromRecord(f map[string]string) TaskView {
	v := TaskView{
		Key:             f["key"],
		Subject:         f["subject"],
		Scope:           f["scope"],
		RunID:           f["runId"],
		Status:          Status(f["status"]),
		Stage:           f["stage"],
		Stages:          splitList(f["stages"]),
		Owner:           f["owner"],
		LastError:       f["lastError"],
		CancelRequested: f["cancel"] == "1",
		FollowUpQueued:  f["followUp"] == "1",
		Waiting:         f["waiting"],
		RequestedAt:     timeField(f["requestedAt"]),
		StartedAt:       timeField(f["startedAt"]),
		UpdatedAt:       timeField(f["updatedAt"]),
		FinishedAt:      timeField(f["finishedAt"]),
		NextAttemptAt:   timeField(f["nextAttemptAt"]),
	}
	if v.Status == "" {
		v.Status = StatusIdle
	}
	v.Attempt, _ = strconv.Atoi(f["attempt"])
	v.MaxAttempts, _ = strconv.Atoi(f["maxAttempts"])
	if v.Attempt > 0 { // 'token' is also the key's fencing counter: a new run shows none yet
		v.FencingToken, _ = strconv.ParseInt(f["token"], 10, 64)
	}
	done, _ := strconv.Atoi(f["done"])
	v.CompletedStages = v.Stages[:min(max(done, 0), len(v.Stages))]
	for _, s := range splitList(f["sources"]) {
		v.Sources = append(v.Sources, Source(s))
	}
	if v.Sources == nil {
		v.Sources = []Source{}
	}
	v.CanCancel = v.Status.Active() && !v.CancelRequested
	return v
}

// viewFields are the record fields a TaskView shows, in the order of
// VIEW_FIELDS in lua/lib.lua: submit.lua replies with their values only
// (viewFromReply).
var viewFields = []string{"runId", "status", "stage", "stages", "done", "attempt", "maxAttempts", "sources",
	"owner", "token", "requestedAt", "startedAt", "updatedAt", "finishedAt", "nextAttemptAt", "lastError",
	"cancel", "followUp", "waiting"}

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

// Event is one entry of a task's history (DESIGN §9), newest first in
// History. Event names: requested, joined, skipped, throttled, started,
// stage, progress, retry-scheduled, recovered, lease-lost, handed-back,
// cancelled, done, failed.
type Event struct {
	At time.Time `json:"at"`
	// Count is how many identical requests (same run, source and outcome)
	// this event stands for: repeats are coalesced into the first one
	// (DESIGN §3). LastAt is the time of the last of them.
	Count        int        `json:"count"`
	LastAt       *time.Time `json:"lastAt,omitempty"`
	RunID        string     `json:"runId"`
	Event        string     `json:"event"`
	Source       string     `json:"source"`
	Stage        string     `json:"stage"`
	Outcome      string     `json:"outcome"`
	Error        string     `json:"error"`
	Owner        string     `json:"owner"`
	FencingToken int64      `json:"fencingToken"`
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
