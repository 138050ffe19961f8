package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/jobs"
)

func TestSubmitAnswersOutcomeAndTaskView(t *testing.T) {
	e := newEnv(t, envOpts{})

	// Empty body: source manual, the job's policy (join).
	r := e.do("POST", "/v1/tasks/u1/course_sync/runs", "")
	mustStatus(t, r, http.StatusOK, "")
	if len(r.body) != 3 || r.body["outcome"] != "started" {
		t.Fatalf("want exactly {outcome: started, runId, task}, got %s", r.raw)
	}
	v := checkTaskView(t, r.body["task"])
	if r.body["runId"] != v["runId"] {
		t.Fatalf("runId %v, want the run started, %v", r.body["runId"], v["runId"])
	}
	if v["key"] != "u1|course_sync" || v["subject"] != "u1" || v["scope"] != "course_sync" || v["status"] != "queued" {
		t.Fatalf("view %v", v)
	}
	if got := strs(v["stages"]); !slices.Equal(got, []string{"pulling", "pushing"}) {
		t.Fatalf("stages %v", got)
	}
	if got := strs(v["sources"]); !slices.Equal(got, []string{"manual"}) {
		t.Fatalf("sources %v", got)
	}
	if v["canCancel"] != true || v["runId"] == "" {
		t.Fatalf("view %v", v)
	}
	if ct := r.header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("content type %q", ct)
	}

	// Explicit source joins the active run and is recorded.
	r = e.do("POST", "/v1/tasks/u1/course_sync/runs", `{"source":"schedule","policy":"join"}`)
	mustStatus(t, r, http.StatusOK, "")
	if r.body["outcome"] != "joined" {
		t.Fatalf("outcome %v", r.body["outcome"])
	}
	v2 := checkTaskView(t, r.body["task"])
	if v2["runId"] != v["runId"] || !slices.Contains(strs(v2["sources"]), "schedule") {
		t.Fatalf("joined view %v", v2)
	}

	for _, tc := range []struct{ body, outcome string }{
		{`{"policy":"skip"}`, "skipped"},
		{`{"policy":"queue","source":"foreground"}`, "queued"},
		{`{"source":"manual"}`, "joined"},
	} {
		r = e.do("POST", "/v1/tasks/u1/course_sync/runs", tc.body)
		mustStatus(t, r, http.StatusOK, "")
		if r.body["outcome"] != tc.outcome {
			t.Fatalf("%s: outcome %v, want %s", tc.body, r.body["outcome"], tc.outcome)
		}
	}
	if v := checkTaskView(t, r.body["task"]); v["followUpQueued"] != true {
		t.Fatalf("followUpQueued not set after a queue request: %v", v)
	}

	// GET answers the same task.
	r = e.do("GET", "/v1/tasks/u1/course_sync", "")
	mustStatus(t, r, http.StatusOK, "")
	g := checkTaskView(t, r.body)
	if g["runId"] != v["runId"] || g["status"] != "queued" {
		t.Fatalf("get %v", g)
	}
}

func TestSubjectWithAllowedPunctuation(t *testing.T) {
	e := newEnv(t, envOpts{})
	subject := "user.42@example.com:eu-1"
	r := e.do("POST", "/v1/tasks/"+url.PathEscape(subject)+"/backup/runs", "{}")
	mustStatus(t, r, http.StatusOK, "")
	if v := checkTaskView(t, r.body["task"]); v["subject"] != subject {
		t.Fatalf("subject %v", v["subject"])
	}
}

func TestCancel(t *testing.T) {
	e := newEnv(t, envOpts{})
	e.do("POST", "/v1/tasks/u1/backup/runs", "")
	r := e.do("POST", "/v1/tasks/u1/backup/cancel", "")
	mustStatus(t, r, http.StatusOK, "")
	if len(r.body) != 1 || r.body["outcome"] != "cancelled" {
		t.Fatalf("cancel of a queued run: %s", r.raw)
	}
	r = e.do("POST", "/v1/tasks/u1/backup/cancel", "")
	mustStatus(t, r, http.StatusOK, "")
	if r.body["outcome"] != "not_running" {
		t.Fatalf("second cancel: %s", r.raw)
	}
	if v := checkTaskView(t, e.do("GET", "/v1/tasks/u1/backup", "").body); v["status"] != "cancelled" || v["canCancel"] != false {
		t.Fatalf("after cancel: %v", v)
	}
}

func TestCancelRunningRun(t *testing.T) {
	e := newEnv(t, envOpts{})
	e.startRunner()
	e.do("POST", "/v1/tasks/u1/course_sync/runs", "")
	waitFor(t, 5*time.Second, "running", func() bool {
		return e.do("GET", "/v1/tasks/u1/course_sync", "").body["status"] == "running"
	})
	v := checkTaskView(t, e.do("GET", "/v1/tasks/u1/course_sync", "").body)
	if v["stage"] != "pulling" || !strings.HasPrefix(v["owner"].(string), "pod-test/") || v["startedAt"] == nil {
		t.Fatalf("running view %v", v)
	}
	if n, _ := v["fencingToken"].(json.Number).Int64(); n < 1 {
		t.Fatalf("fencing token %v", v["fencingToken"])
	}
	r := e.do("POST", "/v1/tasks/u1/course_sync/cancel", "")
	mustStatus(t, r, http.StatusOK, "")
	if r.body["outcome"] != "cancelling" {
		t.Fatalf("cancel of a running run: %s", r.raw)
	}
	waitFor(t, 5*time.Second, "cancelled", func() bool {
		return e.do("GET", "/v1/tasks/u1/course_sync", "").body["status"] == "cancelled"
	})
}

func TestRunProgressesToDone(t *testing.T) {
	e := newEnv(t, envOpts{})
	e.releaseStages()
	e.startRunner()
	e.do("POST", "/v1/tasks/u1/course_sync/runs", "")
	var v map[string]any
	waitFor(t, 5*time.Second, "done", func() bool {
		v = e.do("GET", "/v1/tasks/u1/course_sync", "").body
		return v["status"] == "done"
	})
	v = checkTaskView(t, v)
	if got := strs(v["completedStages"]); !slices.Equal(got, []string{"pulling", "pushing"}) || v["finishedAt"] == nil {
		t.Fatalf("done view %v", v)
	}
	r := e.do("GET", "/v1/tasks/u1/course_sync/history", "")
	mustStatus(t, r, http.StatusOK, "")
	var names []string
	for _, ev := range r.body["events"].([]any) {
		names = append(names, ev.(map[string]any)["event"].(string))
	}
	if len(names) == 0 || names[0] != "done" || !slices.Contains(names, "started") {
		t.Fatalf("history newest first should start with done: %v", names)
	}
}

func TestHistory(t *testing.T) {
	e := newEnv(t, envOpts{})
	e.do("POST", "/v1/tasks/u1/course_sync/runs", `{"source":"schedule"}`)
	e.do("POST", "/v1/tasks/u1/course_sync/runs", `{"source":"foreground"}`)
	e.do("POST", "/v1/tasks/u1/course_sync/runs", `{"policy":"skip"}`)

	r := e.do("GET", "/v1/tasks/u1/course_sync/history", "")
	mustStatus(t, r, http.StatusOK, "")
	if len(r.body) != 1 {
		t.Fatalf("want exactly {events}, got %s", r.raw)
	}
	events := r.body["events"].([]any)
	if len(events) != 3 {
		t.Fatalf("want 3 events, got %s", r.raw)
	}
	first := events[0].(map[string]any)
	for _, f := range eventFields {
		if _, ok := first[f]; !ok {
			t.Fatalf("event lacks %q: %v", f, first)
		}
	}
	if _, ok := first["fencingToken"].(json.Number); !ok {
		t.Fatalf("event fencingToken is %T", first["fencingToken"])
	}
	if at, err := time.Parse(time.RFC3339Nano, first["at"].(string)); err != nil || at.Location() != time.UTC {
		t.Fatalf("at %v: %v", first["at"], err)
	}
	if first["event"] != "skipped" || events[2].(map[string]any)["source"] != "schedule" {
		t.Fatalf("not newest first: %s", r.raw)
	}

	r = e.do("GET", "/v1/tasks/u1/course_sync/history?limit=2", "")
	mustStatus(t, r, http.StatusOK, "")
	if n := len(r.body["events"].([]any)); n != 2 {
		t.Fatalf("limit=2 gave %d events", n)
	}

	// A key that never ran has an empty history, not an error.
	r = e.do("GET", "/v1/tasks/nobody/course_sync/history", "")
	mustStatus(t, r, http.StatusOK, "")
	if string(r.raw) != "{\"events\":[]}\n" {
		t.Fatalf("empty history: %s", r.raw)
	}
}

func TestList(t *testing.T) {
	e := newEnv(t, envOpts{})
	r := e.do("GET", "/v1/tasks", "")
	mustStatus(t, r, http.StatusOK, "")
	if string(r.raw) != "{\"tasks\":[],\"total\":0,\"offset\":0,\"limit\":100}\n" {
		t.Fatalf("empty list: %s", r.raw)
	}
	e.do("POST", "/v1/tasks/u1/course_sync/runs", "")
	e.do("POST", "/v1/tasks/u2/course_sync/runs", "")
	e.do("POST", "/v1/tasks/u1/backup/runs", "")
	e.do("POST", "/v1/tasks/u1/backup/cancel", "")

	keysOf := func(r response) []string {
		t.Helper()
		mustStatus(t, r, http.StatusOK, "")
		var out []string
		for _, v := range r.body["tasks"].([]any) {
			out = append(out, checkTaskView(t, v)["key"].(string))
		}
		slices.Sort(out)
		return out
	}
	for _, tc := range []struct {
		query string
		want  []string
	}{
		{"", []string{"u1|backup", "u1|course_sync", "u2|course_sync"}},
		{"?scope=course_sync", []string{"u1|course_sync", "u2|course_sync"}},
		{"?subject=u1", []string{"u1|backup", "u1|course_sync"}},
		{"?status=cancelled", []string{"u1|backup"}},
		{"?status=queued&scope=backup", nil},
		{"?subject=u2&scope=course_sync", []string{"u2|course_sync"}},
		{"?subject=u9&scope=course_sync", nil},
		{"?limit=1000", []string{"u1|backup", "u1|course_sync", "u2|course_sync"}},
		{"?subjectPrefix=u", []string{"u1|backup", "u1|course_sync", "u2|course_sync"}},
		{"?subjectPrefix=u2", []string{"u2|course_sync"}},
		{"?sort=started&scope=backup", []string{"u1|backup"}},
		{"?offset=3", nil},
	} {
		if got := keysOf(e.do("GET", "/v1/tasks"+tc.query, "")); !slices.Equal(got, tc.want) {
			t.Errorf("list%s = %v, want %v", tc.query, got, tc.want)
		}
	}
	if got := keysOf(e.do("GET", "/v1/tasks?limit=1", "")); len(got) != 1 {
		t.Errorf("limit=1 gave %v", got)
	}
}

// TestBadInput: every bad request gets its status and code, and writes
// nothing to Redis.
func TestBadInput(t *testing.T) {
	e := newEnv(t, envOpts{bodyLimit: 1024})
	// Some state first, so "nothing changes" is checked against real keys.
	e.do("POST", "/v1/tasks/u1/course_sync/runs", "")
	bad := url.PathEscape("bad subject!")
	big := `{"source":"manual","policy":"` + strings.Repeat("x", 2000) + `"}`
	for _, tc := range []struct {
		name, method, path, body string
		status                   int
		code                     string
	}{
		{"bad subject submit", "POST", "/v1/tasks/" + bad + "/course_sync/runs", "", 400, "bad_request"},
		{"bad subject get", "GET", "/v1/tasks/" + bad + "/course_sync", "", 400, "bad_request"},
		{"bad subject cancel", "POST", "/v1/tasks/" + bad + "/course_sync/cancel", "", 400, "bad_request"},
		{"bad subject history", "GET", "/v1/tasks/" + bad + "/course_sync/history", "", 400, "bad_request"},
		{"subject with pipe", "POST", "/v1/tasks/a%7Cb/course_sync/runs", "", 400, "bad_request"},
		{"subject with slash", "POST", "/v1/tasks/a%2Fb/course_sync/runs", "", 400, "bad_request"},
		{"subject too long", "GET", "/v1/tasks/" + strings.Repeat("a", 129) + "/course_sync", "", 400, "bad_request"},
		{"bad scope chars", "POST", "/v1/tasks/u1/Course-Sync/runs", "", 400, "bad_request"},
		{"bad scope get", "GET", "/v1/tasks/u1/course%20sync", "", 400, "bad_request"},
		{"bad source", "POST", "/v1/tasks/u1/course_sync/runs", `{"source":"cron"}`, 400, "bad_request"},
		{"bad policy", "POST", "/v1/tasks/u1/course_sync/runs", `{"policy":"later"}`, 400, "bad_request"},
		{"malformed json", "POST", "/v1/tasks/u1/course_sync/runs", `{"source":`, 400, "bad_request"},
		{"not an object", "POST", "/v1/tasks/u1/course_sync/runs", `["manual"]`, 400, "bad_request"},
		{"wrong type", "POST", "/v1/tasks/u1/course_sync/runs", `{"source":1}`, 400, "bad_request"},
		{"unknown field", "POST", "/v1/tasks/u1/course_sync/runs", `{"source":"manual","priority":1}`, 400, "bad_request"},
		{"trailing data", "POST", "/v1/tasks/u1/course_sync/runs", `{} {}`, 400, "bad_request"},
		{"body too large", "POST", "/v1/tasks/u1/course_sync/runs", big, 413, "payload_too_large"},
		{"history limit 0", "GET", "/v1/tasks/u1/course_sync/history?limit=0", "", 400, "bad_request"},
		{"history limit 1001", "GET", "/v1/tasks/u1/course_sync/history?limit=1001", "", 400, "bad_request"},
		{"history limit abc", "GET", "/v1/tasks/u1/course_sync/history?limit=abc", "", 400, "bad_request"},
		{"list limit -1", "GET", "/v1/tasks?limit=-1", "", 400, "bad_request"},
		{"list bad status", "GET", "/v1/tasks?status=sleeping", "", 400, "bad_request"},
		{"list bad subject", "GET", "/v1/tasks?subject=" + url.QueryEscape("bad subject!"), "", 400, "bad_request"},
		{"list bad scope chars", "GET", "/v1/tasks?scope=Backup!", "", 400, "bad_request"},
		{"list unknown scope", "GET", "/v1/tasks?scope=nope", "", 404, "not_found"},
		{"submit unknown scope", "POST", "/v1/tasks/u1/nope/runs", "", 404, "not_found"},
		{"get unknown scope", "GET", "/v1/tasks/u1/nope", "", 404, "not_found"},
		{"cancel unknown scope", "POST", "/v1/tasks/u1/nope/cancel", "", 404, "not_found"},
		{"history unknown scope", "GET", "/v1/tasks/u1/nope/history", "", 404, "not_found"},
		{"get unknown task", "GET", "/v1/tasks/u2/course_sync", "", 404, "not_found"},
		{"hook empty body", "POST", "/v1/hooks/foreground", "", 400, "bad_request"},
		{"hook bad subject", "POST", "/v1/hooks/foreground", `{"subject":"bad subject!"}`, 400, "bad_request"},
		{"hook no subject", "POST", "/v1/hooks/foreground", `{"scopes":["course_sync"]}`, 400, "bad_request"},
		{"hook unknown field", "POST", "/v1/hooks/foreground", `{"subject":"u1","source":"manual"}`, 400, "bad_request"},
		{"hook bad scope", "POST", "/v1/hooks/foreground", `{"subject":"u1","scopes":["course_sync","Bad!"]}`, 400, "bad_request"},
		{"hook unknown scope", "POST", "/v1/hooks/foreground", `{"subject":"u1","scopes":["course_sync","nope"]}`, 404, "not_found"},
		{"hook too large", "POST", "/v1/hooks/foreground", `{"subject":"u1","scopes":["` + strings.Repeat("a", 2000) + `"]}`, 413, "payload_too_large"},
		{"unknown v1 route", "GET", "/v1/nope", "", 404, "not_found"},
		{"unknown deep route", "GET", "/v1/tasks/u1/course_sync/runs/x", "", 404, "not_found"},
		{"unknown top route", "GET", "/favicon.ico", "", 404, "not_found"},
		{"wrong method", "DELETE", "/v1/tasks/u1/course_sync", "", 405, "method_not_allowed"},
		{"get on runs", "GET", "/v1/tasks/u1/course_sync/runs", "", 405, "method_not_allowed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := e.keys()
			r := e.do(tc.method, tc.path, tc.body)
			mustStatus(t, r, tc.status, tc.code)
			if after := e.keys(); !slices.Equal(before, after) {
				t.Fatalf("redis keys changed:\nbefore %v\nafter  %v", before, after)
			}
			if tc.status == 405 && r.header.Get("Allow") == "" {
				t.Fatalf("405 without Allow header")
			}
		})
	}
}

func TestAuth(t *testing.T) {
	e := newEnv(t, envOpts{token: "s3cret-token"})
	for _, tc := range []struct {
		name, method, path string
		hdr                []string
		status             int
	}{
		{"missing", "GET", "/v1/tasks", nil, 401},
		{"wrong", "GET", "/v1/tasks", []string{"Authorization", "Bearer wrong"}, 401},
		{"prefix of token", "GET", "/v1/tasks", []string{"Authorization", "Bearer s3cret"}, 401},
		{"not bearer", "GET", "/v1/tasks", []string{"Authorization", "Basic s3cret-token"}, 401},
		{"right", "GET", "/v1/tasks", []string{"Authorization", "Bearer s3cret-token"}, 200},
		{"scheme case-insensitive", "GET", "/v1/tasks", []string{"Authorization", "bearer s3cret-token"}, 200},
		{"query token only on events", "GET", "/v1/tasks?access_token=s3cret-token", nil, 401},
		{"submit without token", "POST", "/v1/tasks/u1/course_sync/runs", nil, 401},
		{"submit with token", "POST", "/v1/tasks/u1/course_sync/runs", []string{"Authorization", "Bearer s3cret-token"}, 200},
		{"hook without token", "POST", "/v1/hooks/foreground", nil, 401},
		{"events without token", "GET", "/v1/events", nil, 401},
		{"events wrong query token", "GET", "/v1/events?access_token=nope", nil, 401},
		{"unknown v1 route without token", "GET", "/v1/nope", nil, 401},
		{"escaped prefix", "GET", "/%761/tasks", nil, 401},
		{"dot segments", "GET", "/healthz/../v1/tasks", nil, 401},
		{"healthz open", "GET", "/healthz", nil, 200},
		{"readyz open", "GET", "/readyz", nil, 200},
		{"metrics open", "GET", "/metrics", nil, 200},
		{"dashboard open", "GET", "/", nil, 200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := e.keys()
			r := e.do(tc.method, tc.path, "", tc.hdr...)
			if tc.status == 401 {
				mustStatus(t, r, 401, "unauthorized")
				if !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Bearer") {
					t.Fatalf("WWW-Authenticate %q", r.header.Get("WWW-Authenticate"))
				}
				if after := e.keys(); !slices.Equal(before, after) {
					t.Fatalf("unauthorized request changed redis")
				}
				return
			}
			mustStatus(t, r, tc.status, "")
		})
	}

	// The query token opens the SSE feed (EventSource cannot send headers).
	res, err := e.srv.Client().Get(e.srv.URL + "/v1/events?access_token=s3cret-token")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 || res.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("events with query token: %d %s", res.StatusCode, res.Header.Get("Content-Type"))
	}
}

func TestRedisDown(t *testing.T) {
	e := newEnv(t, envOpts{})
	e.do("POST", "/v1/tasks/u1/course_sync/runs", "")
	e.mini.Close()
	for _, tc := range []struct{ method, path, body string }{
		{"POST", "/v1/tasks/u1/course_sync/runs", `{"source":"manual"}`},
		{"GET", "/v1/tasks/u1/course_sync", ""},
		{"POST", "/v1/tasks/u1/course_sync/cancel", ""},
		{"GET", "/v1/tasks/u1/course_sync/history", ""},
		{"GET", "/v1/tasks", ""},
		{"POST", "/v1/hooks/foreground", `{"subject":"u1"}`},
		{"GET", "/v1/events", ""},
		{"GET", "/readyz", ""},
	} {
		r := e.do(tc.method, tc.path, tc.body)
		mustStatus(t, r, http.StatusServiceUnavailable, "unavailable")
		if strings.Contains(string(r.raw), "127.0.0.1") {
			t.Errorf("%s %s: 503 leaks the Redis address: %s", tc.method, tc.path, r.raw)
		}
	}
	if _, ok := e.logs.find(slog.LevelError, "http: redis unavailable", map[string]string{"path": "/v1/tasks/u1/course_sync/runs"}); !ok {
		t.Error("submit's Redis failure was not logged at error level")
	}
	// Bad input is still bad input, not a Redis failure.
	mustStatus(t, e.do("POST", "/v1/tasks/u1/nope/runs", ""), 404, "not_found")
	mustStatus(t, e.do("POST", "/v1/tasks/u1/course_sync/runs", `{"source":"x"}`), 400, "bad_request")
	// Liveness does not depend on Redis.
	mustStatus(t, e.do("GET", "/healthz", ""), 200, "")
}

func TestRedisOnClosedPort(t *testing.T) {
	// A registry whose client points at a port nobody listens on.
	rdb := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t)), MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	reg, err := jobs.NewRegistry(rdb, jobs.Config{Partitions: 2, Logger: slog.New(slog.DiscardHandler),
		Jobs: []jobs.Job{{Scope: "backup", Stages: []jobs.Stage{{Name: "dumping", Handler: jobs.HandlerFunc(func(context.Context, *jobs.Run) error { return nil })}}}}})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(New(reg, Options{Logger: slog.New(slog.DiscardHandler)}))
	t.Cleanup(srv.Close)
	e := &env{t: t, srv: srv}
	mustStatus(t, e.do("POST", "/v1/tasks/u1/backup/runs", ""), 503, "unavailable")
	mustStatus(t, e.do("GET", "/v1/tasks/u1/backup", ""), 503, "unavailable")
	mustStatus(t, e.do("GET", "/readyz", ""), 503, "unavailable")
	mustStatus(t, e.do("GET", "/v1/tasks/u1/nope", ""), 404, "not_found")
}

func TestReadyCustom(t *testing.T) {
	e := newEnv(t, envOpts{})
	h := New(e.reg, Options{Ready: func(context.Context) error { return errors.New("draining") }, Logger: slog.New(slog.DiscardHandler)})
	w := e.serveWith(h, "GET", "/readyz")
	if w.Code != 503 || !strings.Contains(w.Body.String(), `"code":"unavailable"`) {
		t.Fatalf("readyz: %d %s", w.Code, w.Body)
	}
	w = e.serveWith(h, "GET", "/metrics") // no Metrics handler: 404
	if w.Code != 404 || !strings.Contains(w.Body.String(), `"code":"not_found"`) {
		t.Fatalf("metrics without handler: %d %s", w.Code, w.Body)
	}
}

func TestProbesAndMetrics(t *testing.T) {
	e := newEnv(t, envOpts{})
	r := e.do("GET", "/healthz", "")
	mustStatus(t, r, 200, "")
	if r.body["status"] != "ok" {
		t.Fatalf("healthz %s", r.raw)
	}
	mustStatus(t, e.do("GET", "/readyz", ""), 200, "")
	e.do("POST", "/v1/tasks/u1/course_sync/runs", "")
	r = e.do("GET", "/metrics", "")
	mustStatus(t, r, 200, "")
	if !strings.Contains(string(r.raw), "tasklease_") {
		t.Fatalf("metrics lack tasklease collectors:\n%.500s", r.raw)
	}
}

func TestForegroundHook(t *testing.T) {
	e := newEnv(t, envOpts{})

	// No scopes: only jobs with Foreground (course_sync), source foreground.
	r := e.do("POST", "/v1/hooks/foreground", `{"subject":"u42"}`)
	mustStatus(t, r, 200, "")
	results := r.body["results"].([]any)
	if len(r.body) != 1 || len(results) != 1 {
		t.Fatalf("want one result: %s", r.raw)
	}
	res := results[0].(map[string]any)
	if len(res) != 4 || res["scope"] != "course_sync" || res["outcome"] != "started" || res["runId"] == "" {
		t.Fatalf("result %v", res)
	}
	v := checkTaskView(t, res["task"])
	if !slices.Equal(strs(v["sources"]), []string{"foreground"}) {
		t.Fatalf("sources %v", v["sources"])
	}
	mustStatus(t, e.do("GET", "/v1/tasks/u42/backup", ""), 404, "not_found")

	// Explicit scopes, including a non-foreground job and a repeat.
	r = e.do("POST", "/v1/hooks/foreground", `{"subject":"u42","scopes":["backup","course_sync","backup"]}`)
	mustStatus(t, r, 200, "")
	results = r.body["results"].([]any)
	if len(results) != 2 {
		t.Fatalf("want two results: %s", r.raw)
	}
	got := map[string]string{}
	for _, x := range results {
		m := x.(map[string]any)
		got[m["scope"].(string)] = m["outcome"].(string)
		if !slices.Contains(strs(checkTaskView(t, m["task"])["sources"]), "foreground") {
			t.Fatalf("no foreground source in %v", m)
		}
	}
	if got["backup"] != "started" || got["course_sync"] != "joined" {
		t.Fatalf("outcomes %v", got)
	}

	// An unknown scope anywhere in the list: 404 and nothing submitted.
	before := e.keys()
	r = e.do("POST", "/v1/hooks/foreground", `{"subject":"u7","scopes":["course_sync","nope"]}`)
	mustStatus(t, r, 404, "not_found")
	if after := e.keys(); !slices.Equal(before, after) {
		t.Fatalf("unknown scope submitted something:\n%v\n%v", before, after)
	}
	mustStatus(t, e.do("GET", "/v1/tasks/u7/course_sync", ""), 404, "not_found")
}

func TestDashboard(t *testing.T) {
	e := newEnv(t, envOpts{})
	r := e.do("GET", "/", "")
	mustStatus(t, r, 200, "")
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/html") {
		t.Fatalf("content type %q", ct)
	}
	page := string(r.raw)
	for _, want := range []string{"tasklease", "/v1/tasks", "/v1/events", "EventSource", "sessionStorage", "access_token", "canCancel"} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
	// Self-contained: no external scripts, styles or fetches.
	for _, bad := range []string{"http://", "https://", "src=", "<link rel=\"stylesheet\""} {
		if strings.Contains(page, bad) {
			t.Errorf("page references an external asset (%q)", bad)
		}
	}
	csp := r.header.Get("Content-Security-Policy")
	if strings.Count(csp, "'sha256-") != 2 || strings.Contains(csp, "unsafe-inline") {
		t.Fatalf("CSP should allow exactly the inline script and style by hash: %q", csp)
	}
	if r.header.Get("X-Content-Type-Options") != "nosniff" {
		t.Fatal("nosniff missing")
	}
}

func TestAccessLog(t *testing.T) {
	e := newEnv(t, envOpts{})
	e.do("GET", "/v1/tasks/u1/course_sync?x=1", "")
	attrs, ok := e.logs.find(slog.LevelDebug, "http", map[string]string{"method": "GET", "path": "/v1/tasks/u1/course_sync"})
	if !ok {
		t.Fatal("no access log record")
	}
	if attrs["status"].Int64() != 404 || attrs["duration"].Kind() != slog.KindDuration {
		t.Fatalf("access log attrs %v", attrs)
	}
}

func TestNewServer(t *testing.T) {
	srv := NewServer("127.0.0.1:0", http.NotFoundHandler())
	if srv.ReadHeaderTimeout != 5*time.Second || srv.ReadTimeout != 30*time.Second ||
		srv.WriteTimeout != 0 || srv.IdleTimeout != 120*time.Second || srv.MaxHeaderBytes != 64<<10 {
		t.Fatalf("server timeouts %+v", srv)
	}
	// Shutdown may be called twice without panicking.
	if err := srv.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := srv.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestRequestTimeout: a Redis call that hangs is cut by the per-request
// context deadline and answered 503.
func TestRequestTimeout(t *testing.T) {
	e := newEnv(t, envOpts{})
	h := newAPI(e.reg, Options{
		Logger: slog.New(slog.DiscardHandler),
		Ready: func(ctx context.Context) error {
			<-ctx.Done()
			return ctx.Err()
		},
	}, settings{keepAlive: time.Second, requestTimeout: 50 * time.Millisecond, writeGrace: time.Second})
	start := time.Now()
	w := e.serveWith(h, "GET", "/readyz")
	if w.Code != 503 || time.Since(start) > 2*time.Second {
		t.Fatalf("hung probe: %d after %s", w.Code, time.Since(start))
	}
}
