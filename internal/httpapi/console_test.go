package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tasklease/tasklease/triggers"
)

func TestScopesPauseAndResume(t *testing.T) {
	e := newEnv(t, envOpts{})
	e.startRunner()
	r := e.do("GET", "/v1/scopes", "")
	mustStatus(t, r, http.StatusOK, "")
	scopes := r.body["scopes"].([]any)
	if len(scopes) != 2 {
		t.Fatalf("scopes: %s", r.raw)
	}
	cs := scopes[1].(map[string]any)
	if cs["scope"] != "course_sync" || cs["paused"] != false || cs["policy"] != "join" ||
		len(cs["throughput"].([]any)) != 30 || strings.Join(strs(cs["stages"]), ",") != "pulling,pushing" {
		t.Fatalf("course_sync summary: %v", cs)
	}
	for _, st := range []string{"queued", "running", "retrying", "done", "failed", "cancelled"} {
		if _, ok := cs["counts"].(map[string]any)[st]; !ok {
			t.Errorf("counts lack %s: %v", st, cs["counts"])
		}
	}
	if q := r.body["queue"].(map[string]any); q["stream"] == nil || q["retry"] == nil {
		t.Errorf("queue: %v", q)
	}

	r = e.do("POST", "/v1/scopes/course_sync/pause", "")
	mustStatus(t, r, http.StatusOK, "")
	if string(r.raw) != `{"scope":"course_sync","paused":true}`+"\n" {
		t.Fatalf("pause: %s", r.raw)
	}
	r = e.do("GET", "/v1/scopes", "")
	if r.body["scopes"].([]any)[1].(map[string]any)["paused"] != true {
		t.Fatalf("scopes after pause: %s", r.raw)
	}
	mustStatus(t, e.do("POST", "/v1/tasks/u1/course_sync/runs", ""), http.StatusOK, "")
	waitFor(t, 10*time.Second, "u1 parked", func() bool {
		v := e.do("GET", "/v1/tasks/u1/course_sync", "")
		return v.body["status"] == "queued" && strings.Contains(fmt.Sprint(v.body["waiting"]), "paused")
	})
	r = e.do("POST", "/v1/scopes/course_sync/resume", "")
	mustStatus(t, r, http.StatusOK, "")
	if string(r.raw) != `{"scope":"course_sync","paused":false,"requeued":1}`+"\n" {
		t.Fatalf("resume: %s", r.raw)
	}
	waitFor(t, 10*time.Second, "u1 running", func() bool {
		return e.do("GET", "/v1/tasks/u1/course_sync", "").body["status"] == "running"
	})

	mustStatus(t, e.do("POST", "/v1/scopes/nope/pause", ""), http.StatusNotFound, "not_found")
	mustStatus(t, e.do("POST", "/v1/scopes/Bad-Scope/resume", ""), http.StatusBadRequest, "bad_request")
	mustStatus(t, e.do("GET", "/v1/scopes/course_sync/pause", ""), http.StatusMethodNotAllowed, "method_not_allowed")
}

func TestRunnersAndSchedules(t *testing.T) {
	next := time.Date(2026, 1, 1, 0, 15, 0, 0, time.UTC)
	e := newEnv(t, envOpts{schedules: func(context.Context) ([]triggers.ScheduleStatus, error) {
		return []triggers.ScheduleStatus{{Name: "sync-15m", Cron: "*/15 * * * *", Scope: "course_sync",
			Subjects: triggers.SubjectsCount{All: true}, NextOccurrence: &next, Leader: "pod-test/abc"}}, nil
	}})
	e.startRunner()
	var rn map[string]any
	waitFor(t, 10*time.Second, "the runner listed", func() bool {
		r := e.do("GET", "/v1/runners", "")
		mustStatus(t, r, http.StatusOK, "")
		list := r.body["runners"].([]any)
		if len(list) == 1 {
			rn = list[0].(map[string]any)
		}
		return rn != nil
	})
	if rn["id"] != "pod-test" || rn["alive"] != true || !strings.HasPrefix(rn["owner"].(string), "pod-test/") ||
		rn["concurrency"] != json.Number("16") || rn["heartbeatAt"] == nil {
		t.Errorf("runner: %v", rn)
	}
	r := e.do("GET", "/v1/schedules", "")
	mustStatus(t, r, http.StatusOK, "")
	sc := r.body["schedules"].([]any)
	if len(sc) != 1 || sc[0].(map[string]any)["subjects"] != "all" || sc[0].(map[string]any)["nextOccurrence"] != "2026-01-01T00:15:00Z" {
		t.Errorf("schedules: %s", r.raw)
	}
	// Without a scheduler: an empty list, not null.
	if r := newEnv(t, envOpts{}).do("GET", "/v1/schedules", ""); string(r.raw) != `{"schedules":[]}`+"\n" {
		t.Errorf("no schedules: %s", r.raw)
	}
}

func TestCancelMatching(t *testing.T) {
	e := newEnv(t, envOpts{})
	for _, s := range []string{"team1", "team2", "user1"} {
		e.do("POST", "/v1/tasks/"+s+"/course_sync/runs", "")
	}
	e.do("POST", "/v1/tasks/team1/backup/runs", "")
	r := e.do("POST", "/v1/tasks/cancel", `{"scope":"course_sync","subjectPrefix":"team","dryRun":true}`)
	mustStatus(t, r, http.StatusOK, "")
	if string(r.raw) != `{"matched":2,"cancelling":0,"cancelled":0,"notRunning":0}`+"\n" {
		t.Fatalf("dry run: %s", r.raw)
	}
	r = e.do("POST", "/v1/tasks/cancel", `{"subjectPrefix":"team"}`)
	if string(r.raw) != `{"matched":3,"cancelling":0,"cancelled":3,"notRunning":0}`+"\n" {
		t.Fatalf("cancel: %s", r.raw)
	}
	if v := e.do("GET", "/v1/tasks/user1/course_sync", ""); v.body["status"] != "queued" {
		t.Errorf("user1 %v, want it left queued", v.body["status"])
	}
	for _, tc := range []struct{ body, code string }{
		{"", "bad_request"},
		{`{"status":"nope"}`, "bad_request"},
		{`{"subjectPrefix":"a b"}`, "bad_request"},
		{`{"scope":"nope"}`, "not_found"},
		{`{"limit":5}`, "bad_request"},
	} {
		want := http.StatusBadRequest
		if tc.code == "not_found" {
			want = http.StatusNotFound
		}
		mustStatus(t, e.do("POST", "/v1/tasks/cancel", tc.body), want, tc.code)
	}
	for _, q := range []string{"?offset=-1", "?offset=x", "?sort=oldest", "?subjectPrefix=a%20b"} {
		mustStatus(t, e.do("GET", "/v1/tasks"+q, ""), http.StatusBadRequest, "bad_request")
	}
}
