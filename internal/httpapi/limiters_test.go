package httpapi

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tasklease/tasklease/internal/keyspace"
	"github.com/tasklease/tasklease/taskkey"
)

// limiterKey is the hash of a limiter of the test env (the default prefix).
func limiterKey(name string) string { return "{tasklease:limiter:" + name + "}" }

func TestLimitersRoute(t *testing.T) {
	// None configured: an empty list, and no Redis command for it.
	if r := newEnv(t, envOpts{}).do("GET", "/v1/limiters", ""); string(r.raw) != `{"limiters":[]}`+"\n" {
		t.Errorf("no limiters: %d %s", r.status, r.raw)
	}

	e := newEnv(t, envOpts{limited: true})
	r := e.do("GET", "/v1/limiters", "")
	mustStatus(t, r, http.StatusOK, "")
	want := `{"limiters":[` +
		`{"name":"job.course_sync","concurrency":100,"inUse":0,"waiting":0,"jobs":["course_sync"]},` +
		`{"name":"remote_store","concurrency":50,"inUse":0,"rate":"20/s","burst":10,"waiting":0,"jobs":["course_sync"]}]}` + "\n"
	if string(r.raw) != want {
		t.Errorf("idle limiters:\n got %s\nwant %s", r.raw, want)
	}

	// Two slots held (one more expired), one run waiting, starts held for a
	// minute: what the limiter scripts keep in the limiter's hash slot.
	now := time.Now()
	live, gone := float64(now.Add(time.Minute).UnixMilli()), float64(now.Add(-time.Second).UnixMilli())
	k := limiterKey("remote_store")
	e.mini.ZAdd(k+":slots", live, "run-a")
	e.mini.ZAdd(k+":slots", live, "run-b")
	e.mini.ZAdd(k+":slots", gone, "run-c")
	e.mini.HSet(k+":wmeta", "run-d", "x")
	held := now.Add(time.Minute).Truncate(time.Millisecond).UTC()
	e.mini.HSet(k, "holdUntil", strconv.FormatInt(held.UnixMilli(), 10))
	r = e.do("GET", "/v1/limiters", "")
	mustStatus(t, r, http.StatusOK, "")
	want = `{"name":"remote_store","concurrency":50,"inUse":2,"rate":"20/s","burst":10,"waiting":1,"heldUntil":"` +
		held.Format(time.RFC3339Nano) + `","jobs":["course_sync"]}]}`
	if !strings.HasSuffix(strings.TrimSpace(string(r.raw)), want) {
		t.Errorf("busy limiter:\n got %s\nwant ...%s", r.raw, want)
	}

	// The rules of every /v1 GET: a token when set, no cross-site caller,
	// the method the route serves.
	te := newEnv(t, envOpts{limited: true, token: "s3cret"})
	mustStatus(t, te.do("GET", "/v1/limiters", ""), http.StatusUnauthorized, "unauthorized")
	mustStatus(t, te.do("GET", "/v1/limiters", "", "Authorization", "Bearer s3cret"), http.StatusOK, "")
	mustStatus(t, e.do("GET", "/v1/limiters", "", "Sec-Fetch-Site", "cross-site"), http.StatusForbidden, "forbidden")
	mustStatus(t, e.do("POST", "/v1/limiters", ""), http.StatusMethodNotAllowed, "method_not_allowed")

	// Redis unreachable: 503.
	e.mini.Close()
	mustStatus(t, e.do("GET", "/v1/limiters", ""), http.StatusServiceUnavailable, "unavailable")
}

// A submit's group reaches the task record (field group) when it starts
// the run; a bad one is a 400 that writes nothing.
func TestSubmitGroupField(t *testing.T) {
	e := newEnv(t, envOpts{limited: true})
	ks, err := keyspace.New("tasklease", 4)
	if err != nil {
		t.Fatal(err)
	}
	record := func(subject string) string { return ks.Task(taskkey.MustNew(subject, "course_sync")) }

	r := e.do("POST", "/v1/tasks/u1/course_sync/runs", `{"group":"acme"}`)
	mustStatus(t, r, http.StatusOK, "")
	if r.body["outcome"] != "started" || e.mini.HGet(record("u1"), "group") != "acme" {
		t.Fatalf("started with group acme: %s; record group %q", r.raw, e.mini.HGet(record("u1"), "group"))
	}
	// A join's group changes nothing; a request without one writes none.
	mustStatus(t, e.do("POST", "/v1/tasks/u1/course_sync/runs", `{"group":"other","source":"foreground"}`), http.StatusOK, "")
	mustStatus(t, e.do("POST", "/v1/tasks/u2/course_sync/runs", `{}`), http.StatusOK, "")
	if g := e.mini.HGet(record("u1"), "group"); g != "acme" {
		t.Errorf("after a join with group other: %q, want acme", g)
	}
	if e.mini.Exists(record("u2")) && e.mini.HGet(record("u2"), "group") != "" {
		t.Errorf("u2 without a group has one: %q", e.mini.HGet(record("u2"), "group"))
	}

	for _, g := range []string{`"a b"`, `"a|b"`, `"` + strings.Repeat("g", 65) + `"`, `"\u0000"`, `"tab\t"`, `"\u200b"`, `7`} {
		for _, subject := range []string{"u1", "u3"} { // an active run, a new key
			before := e.mini.Dump()
			r := e.do("POST", "/v1/tasks/"+subject+"/course_sync/runs", `{"group":`+g+`}`)
			mustStatus(t, r, http.StatusBadRequest, "bad_request")
			if e.mini.Dump() != before {
				t.Errorf("group %s on %s changed redis", g, subject)
			}
		}
	}
}
