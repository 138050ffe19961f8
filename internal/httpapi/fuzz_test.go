package httpapi

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tasklease/tasklease/jobs"
	"github.com/tasklease/tasklease/taskkey"
)

// Fuzz targets call the handler in-process against miniredis. Redis is up
// throughout, so a 503 would be bad input misread as a Redis failure: the
// targets treat it as a bug, like any 500 or panic. Any answer other than
// 200 must leave Redis untouched.

// redirects are the mux's answers to non-canonical paths (301 for GET,
// 307 otherwise, which keeps the method).
var redirects = []int{http.StatusMovedPermanently, http.StatusTemporaryRedirect, http.StatusPermanentRedirect}

// fuzzBodyLimit keeps the 413 path reachable by the fuzzer.
const fuzzBodyLimit = 256

func FuzzSubmitBody(f *testing.F) {
	for _, s := range []string{
		"", " ", "{}", "null", `{"source":"manual"}`, `{"policy":"join"}`,
		`{"source":"schedule","policy":"queue"}`, `{"source":"foreground","policy":"skip"}`,
		`{"source":"retry","policy":"replace"}`, `{"source":"cron"}`, `{"policy":""}`,
		`{"source":1}`, `{"priority":1}`, `{"SOURCE":"manual"}`, `{} {}`, `{"source":"manual"`,
		`[]`, `"manual"`, "\x00", `{"source":"\u0000"}`, strings.Repeat(" ", 300),
		`{"source":"manual","source":"bogus"}`, `{}}`,
		`{"delay":"90s"}`, `{"delay":"-1s"}`, `{"delay":"soon"}`, `{"delay":"1000h"}`,
		`{"notBefore":"2026-12-03T14:05:00Z"}`, `{"notBefore":"tomorrow"}`, `{"delay":"1s","notBefore":"2020-01-01T00:00:00Z"}`,
		`{"group":"acme"}`, `{"group":""}`, `{"group":"acme:eu","delay":"5s"}`, `{"group":"a b"}`, `{"group":"a|b"}`,
		`{"group":"t@1+2~3"}`, `{"group":"\u0000"}`, `{"group":"\u00a0"}`, `{"group":"租户"}`, `{"group":7}`, `{"group":null}`,
		`{"group":"` + strings.Repeat("g", 64) + `"}`, `{"group":"` + strings.Repeat("g", 65) + `"}`, `{"group":"\ud800"}`,
	} {
		f.Add([]byte(s))
	}
	e := newEnv(f, envOpts{bodyLimit: fuzzBodyLimit, noServer: true, noMetrics: true})
	f.Fuzz(func(t *testing.T, body []byte) {
		before := e.keys()
		w := e.serve("POST", "/v1/tasks/u1/course_sync/runs", body)
		checkAnswer(t, w.Code, w.Body.Bytes(), http.StatusOK, http.StatusBadRequest, http.StatusRequestEntityTooLarge)
		if w.Code != http.StatusOK {
			if after := e.keys(); !slices.Equal(before, after) {
				t.Fatalf("status %d changed redis", w.Code)
			}
		}
		// Oracle: a well-formed body with valid values must be accepted,
		// and one with a bad group refused (before anything is written).
		if len(body) <= fuzzBodyLimit {
			var sb submitBody
			dec := json.NewDecoder(bytes.NewReader(body))
			dec.DisallowUnknownFields()
			wellFormed := json.Valid(body) && dec.Decode(&sb) == nil
			if wellFormed && validSource(sb.Source) && validPolicy(sb.Policy) && validDelays(sb) &&
				jobs.ValidateGroup(sb.Group) == nil && w.Code != http.StatusOK {
				t.Fatalf("valid body %q answered %d %s", body, w.Code, w.Body)
			}
			if wellFormed && jobs.ValidateGroup(sb.Group) != nil && w.Code != http.StatusBadRequest {
				t.Fatalf("body %q with a bad group answered %d %s", body, w.Code, w.Body)
			}
		}
	})
}

func FuzzPathSegments(f *testing.F) {
	for _, s := range [][2]string{
		{"u1", "course_sync"}, {"u42", "backup"}, {"bad subject!", "course_sync"}, {"u1", "Course-Sync"},
		{"", "course_sync"}, {"u1", ""}, {".", ".."}, {"a/b", "c"}, {"a|b", "backup"}, {"u1", "nope"},
		{"user@example.com", "backup"}, {strings.Repeat("a", 129), "backup"}, {"ü", "backup"},
		{"u1", "course_sync/runs"}, {"%2F", "%"}, {"\x00", "\n"}, {"-x", "backup"}, {".", "."}, {"a..", "backup"},
	} {
		f.Add(s[0], s[1])
	}
	e := newEnv(f, envOpts{noServer: true, noMetrics: true})
	f.Fuzz(func(t *testing.T, subject, scope string) {
		base := "/v1/tasks/" + url.PathEscape(subject) + "/" + url.PathEscape(scope)
		_, keyErr := taskkey.New(subject, scope)
		_, known := e.reg.Job(scope)

		before := e.keys()
		w := e.serve("GET", base, nil)
		// Redirects: the mux cleans paths with "." / ".." or empty segments.
		checkAnswer(t, w.Code, w.Body.Bytes(), slices.Concat(redirects, []int{http.StatusOK, http.StatusBadRequest, http.StatusNotFound})...)
		if after := e.keys(); !slices.Equal(before, after) {
			t.Fatalf("GET changed redis")
		}

		w = e.serve("POST", base+"/runs", nil)
		checkAnswer(t, w.Code, w.Body.Bytes(), slices.Concat(redirects, []int{http.StatusOK, http.StatusBadRequest, http.StatusNotFound})...)
		if w.Code == http.StatusOK && (keyErr != nil || !known) {
			t.Fatalf("accepted invalid key %q|%q", subject, scope)
		}
		if w.Code != http.StatusOK {
			if after := e.keys(); !slices.Equal(before, after) {
				t.Fatalf("rejected submit (%d) changed redis", w.Code)
			}
		}
		if keyErr == nil && known && w.Code != http.StatusOK {
			t.Fatalf("valid key %q|%q answered %d %s", subject, scope, w.Code, w.Body)
		}
		if keyErr != nil && w.Code != http.StatusBadRequest && w.Code != http.StatusNotFound && !slices.Contains(redirects, w.Code) {
			t.Fatalf("invalid key %q|%q answered %d", subject, scope, w.Code)
		}
	})
}

func FuzzForegroundBody(f *testing.F) {
	for _, s := range []string{
		"", "{}", "null", `{"subject":"u42"}`, `{"subject":"u42","scopes":[]}`,
		`{"subject":"u42","scopes":["course_sync"]}`, `{"subject":"u42","scopes":["backup","course_sync"]}`,
		`{"subject":"u42","scopes":["nope"]}`, `{"subject":"u42","scopes":["Bad!"]}`, `{"subject":"bad subject"}`,
		`{"subject":"u42","scopes":"course_sync"}`, `{"subject":"u42","scopes":[null]}`, `{"subject":"u42","x":1}`,
		`{"subject":42}`, `{"subject":"u42"} []`,
	} {
		f.Add([]byte(s))
	}
	e := newEnv(f, envOpts{bodyLimit: fuzzBodyLimit, noServer: true, noMetrics: true})
	f.Fuzz(func(t *testing.T, body []byte) {
		before := e.keys()
		w := e.serve("POST", "/v1/hooks/foreground", body)
		checkAnswer(t, w.Code, w.Body.Bytes(), http.StatusOK, http.StatusBadRequest, http.StatusNotFound, http.StatusRequestEntityTooLarge)
		if w.Code != http.StatusOK {
			if after := e.keys(); !slices.Equal(before, after) {
				t.Fatalf("status %d changed redis", w.Code)
			}
			return
		}
		var res foregroundResponse
		if err := json.Unmarshal(w.Body.Bytes(), &res); err != nil {
			t.Fatalf("200 body %s: %v", w.Body, err)
		}
		for _, r := range res.Results {
			// Both jobs join by default, so every request lands in the run.
			if r.Outcome != jobs.OutcomeStarted && r.Outcome != jobs.OutcomeJoined ||
				!slices.Contains(r.Task.Sources, jobs.SourceForeground) {
				t.Fatalf("result without source foreground: %+v", r)
			}
		}
	})
}

// checkAnswer fails on a status outside allowed and on a body that is not
// the API's JSON (success or error shape).
func checkAnswer(t *testing.T, status int, body []byte, allowed ...int) {
	t.Helper()
	if !slices.Contains(allowed, status) {
		t.Fatalf("status %d not in %v: %s", status, allowed, body)
	}
	if slices.Contains(redirects, status) {
		return
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("status %d body is not a JSON object: %q", status, body)
	}
	if status >= 400 {
		var eb errorBody
		if err := json.Unmarshal(body, &eb); err != nil || eb.Error.Code == "" || eb.Error.Message == "" {
			t.Fatalf("status %d without the error shape: %s", status, body)
		}
	}
}

func validSource(s string) bool {
	if s == "" {
		return true
	}
	_, err := jobs.ParseSource(s)
	return err == nil
}

func validPolicy(s string) bool {
	if s == "" {
		return true
	}
	_, err := jobs.ParsePolicy(s)
	return err == nil
}

// FuzzTaskFilter: the console's task filter, as GET /v1/tasks query and as
// the body of POST /v1/tasks/cancel (a dry run, so Redis never changes).
func FuzzTaskFilter(f *testing.F) {
	for _, s := range [][5]string{
		{"", "", "", "", ""}, {"running", "course_sync", "u", "updated", "0"}, {"done", "backup", "", "started", "50"},
		{"nope", "", "", "", ""}, {"", "Bad", "", "", ""}, {"", "nope", "", "", ""}, {"", "", "a b", "", ""},
		{"", "", "", "oldest", ""}, {"", "", "", "", "-1"}, {"", "", "", "", "x"}, {"", "", "\x00", "", "1e3"},
		{"queued", "", strings.Repeat("a", 129), "", "99999999999999999999"},
	} {
		f.Add(s[0], s[1], s[2], s[3], s[4])
	}
	e := newEnv(f, envOpts{noServer: true, noMetrics: true})
	e.serve("POST", "/v1/tasks/u1/course_sync/runs", nil)
	f.Fuzz(func(t *testing.T, status, scope, prefix, sort, offset string) {
		q := url.Values{"status": {status}, "scope": {scope}, "subjectPrefix": {prefix}, "sort": {sort}, "offset": {offset}}
		w := e.serve("GET", "/v1/tasks?"+q.Encode(), nil)
		checkAnswer(t, w.Code, w.Body.Bytes(), http.StatusOK, http.StatusBadRequest, http.StatusNotFound)
		body, err := json.Marshal(map[string]any{"status": status, "scope": scope, "subjectPrefix": prefix, "dryRun": true})
		if err != nil {
			t.Fatal(err)
		}
		before := e.keys()
		w = e.serve("POST", "/v1/tasks/cancel", body)
		checkAnswer(t, w.Code, w.Body.Bytes(), http.StatusOK, http.StatusBadRequest, http.StatusNotFound)
		if after := e.keys(); !slices.Equal(before, after) {
			t.Fatalf("a dry run changed redis (%d)", w.Code)
		}
	})
}

// validDelays reports whether the body's delay fields are acceptable:
// parsable and within jobs.DelayMax.
func validDelays(sb submitBody) bool {
	o, err := sb.options()
	return err == nil && time.Until(o.NotBefore) <= jobs.DelayMax
}
