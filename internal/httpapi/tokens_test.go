package httpapi

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/tasklease/tasklease/internal/apptoken"
	"github.com/tasklease/tasklease/internal/apptoken/apptokentest"
	"github.com/tasklease/tasklease/jobs"
)

// Credentials of the token tests.
const (
	opToken    = "operator-token-0123456789"
	readTok    = "read-only-token-0123456789"
	appSecret  = "app-secret-0123456789abcdef0123456789"
	appIssuer  = "https://idp.test/"
	appAudence = "tasklease"
)

// claims returns valid claims for subject, changed by kv pairs (a nil
// value deletes the claim).
func claims(subject string, kv ...any) jwt.MapClaims {
	c := jwt.MapClaims{"sub": subject, "exp": time.Now().Add(10 * time.Minute).Unix(), "iss": appIssuer, "aud": appAudence}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] == nil {
			delete(c, kv[i].(string))
		} else {
			c[kv[i].(string)] = kv[i+1]
		}
	}
	return c
}

func signHS(t testing.TB, key []byte, c jwt.MapClaims) string {
	t.Helper()
	return apptokentest.HS256(t, key, c, nil)
}

// newTokenEnv is an env with an operator token, a read-only token and
// subject tokens (HMAC secret and a JWKS, issuer and audience checked).
func newTokenEnv(t *testing.T, o envOpts) (*env, *apptokentest.JWKS) {
	t.Helper()
	j := apptokentest.NewJWKS(t)
	v, err := apptoken.NewVerifier(t.Context(), apptoken.Config{HMACSecret: appSecret, JWKSURL: j.URL, Issuer: appIssuer, Audience: appAudence})
	if err != nil {
		t.Fatal(err)
	}
	o.token, o.readToken, o.subjects = opToken, readTok, v
	return newEnv(t, o), j
}

// routeCase is one request of the table.
type routeCase struct {
	name, method, path, body string
	// own: the route is open to a subject token for u42 with every scope
	// and action (its subject is u42, its scope course_sync).
	own bool
	// action the route needs from a subject token.
	action apptoken.Action
}

var tokenRoutes = []routeCase{
	{"submit", "POST", "/v1/tasks/u42/course_sync/runs", "", true, apptoken.ActionSubmit},
	{"get", "GET", "/v1/tasks/u42/course_sync", "", true, apptoken.ActionRead},
	{"get escaped", "GET", "/v1/tasks/u%342/course_sync", "", true, apptoken.ActionRead},
	{"history", "GET", "/v1/tasks/u42/course_sync/history", "", true, apptoken.ActionRead},
	{"cancel", "POST", "/v1/tasks/u42/course_sync/cancel", "", true, apptoken.ActionCancel},
	{"foreground", "POST", "/v1/hooks/foreground", `{"subject":"u42","scopes":["course_sync"]}`, true, apptoken.ActionSubmit},
	{"subject events", "GET", "/v1/subjects/u42/events", "", true, apptoken.ActionRead},
	// Other subjects: u4 (a prefix), and subjects with | or / escaped
	// into the path segment.
	{"submit u4", "POST", "/v1/tasks/u4/course_sync/runs", "", false, apptoken.ActionSubmit},
	{"get u420", "GET", "/v1/tasks/u420/course_sync", "", false, apptoken.ActionRead},
	{"submit pipe", "POST", "/v1/tasks/u42%7Ccourse_sync/course_sync/runs", "", false, apptoken.ActionSubmit},
	{"submit slash", "POST", "/v1/tasks/u42%2Fx/course_sync/runs", "", false, apptoken.ActionSubmit},
	{"cancel u4", "POST", "/v1/tasks/u4/course_sync/cancel", "", false, apptoken.ActionCancel},
	{"history u4", "GET", "/v1/tasks/u4/course_sync/history", "", false, apptoken.ActionRead},
	{"foreground u4", "POST", "/v1/hooks/foreground", `{"subject":"u4","scopes":["course_sync"]}`, false, apptoken.ActionSubmit},
	{"subject events u4", "GET", "/v1/subjects/u4/events", "", false, apptoken.ActionRead},
	{"subject events slash", "GET", "/v1/subjects/u42%2Fx/events", "", false, apptoken.ActionRead},
	// Operator routes.
	{"list", "GET", "/v1/tasks?subject=u42", "", false, ""},
	{"cancel matching", "POST", "/v1/tasks/cancel", `{"subject":"u42"}`, false, ""},
	{"scopes", "GET", "/v1/scopes", "", false, ""},
	{"pause", "POST", "/v1/scopes/course_sync/pause", "", false, ""},
	{"resume", "POST", "/v1/scopes/backup/resume", "", false, ""},
	{"runners", "GET", "/v1/runners", "", false, ""},
	{"limiters", "GET", "/v1/limiters", "", false, ""},
	{"schedules", "GET", "/v1/schedules", "", false, ""},
	{"events", "GET", "/v1/events", "", false, ""},
	{"openapi", "GET", "/v1/openapi.json", "", false, ""},
}

// TestTokenAuthorizationTable sends every route with every kind of
// credential: each answer is checked, every refusal (401, 403) leaves Redis
// exactly as it was, and no log line or answer ever holds a token.
func TestTokenAuthorizationTable(t *testing.T) {
	e, j := newTokenEnv(t, envOpts{})
	hs := func(c jwt.MapClaims) string { return signHS(t, []byte(appSecret), c) }
	past := time.Now().Add(-time.Hour).Unix()
	future := time.Now().Add(time.Hour).Unix()

	// want: "ok" (served: neither 401 nor 403), "401", "403".
	type kind struct {
		name, token string
		query       bool // sent as ?access_token= (the stream routes only)
		want        func(rc routeCase) string
	}
	always := func(w string) func(routeCase) string { return func(routeCase) string { return w } }
	subjectRule := func(allowScope func(routeCase) bool, allowAction func(apptoken.Action) bool) func(routeCase) string {
		return func(rc routeCase) string {
			if rc.own && allowScope(rc) && allowAction(rc.action) {
				return "ok"
			}
			return "403"
		}
	}
	every := func(routeCase) bool { return true }
	anyAction := func(apptoken.Action) bool { return true }
	kinds := []kind{
		{"none", "", false, always("401")},
		{"operator", opToken, false, always("ok")},
		{"operator wrong", opToken + "x", false, always("401")},
		{"read-only", readTok, false, func(rc routeCase) string {
			if rc.method == "GET" {
				return "ok"
			}
			return "403"
		}},
		{"subject u42 hs256", hs(claims("u42")), false, subjectRule(every, anyAction)},
		{"subject u42 jwks", j.Sign(t, claims("u42")), false, subjectRule(every, anyAction)},
		{"subject u4", hs(claims("u4")), false, func(rc routeCase) string {
			if strings.HasSuffix(rc.name, " u4") { // u4's own routes
				return "ok"
			}
			return "403"
		}},
		{"subject with pipe", hs(claims("u42|course_sync")), false, always("401")},
		{"subject with slash", hs(claims("u42/x")), false, always("401")},
		{"wrong audience", hs(claims("u42", "aud", "other")), false, always("401")},
		{"wrong issuer", j.Sign(t, claims("u42", "iss", "https://evil.test/")), false, always("401")},
		{"expired", hs(claims("u42", "exp", past)), false, always("401")},
		{"exp missing", hs(claims("u42", "exp", nil)), false, always("401")},
		{"exp 0", hs(claims("u42", "exp", 0)), false, always("401")},
		{"nbf future", hs(claims("u42", "nbf", future)), false, always("401")},
		{"alg none", apptokentest.Unsigned(claims("u42")), false, always("401")},
		{"hs256 with the jwks public key", func() string {
			tok := jwt.NewWithClaims(jwt.SigningMethodHS256, claims("u42"))
			tok.Header["kid"] = "k1"
			s, err := tok.SignedString(j.PublicDER)
			if err != nil {
				t.Fatal(err)
			}
			return s
		}(), false, always("401")},
		{"wrong secret", signHS(t, []byte(strings.Repeat("s", 40)), claims("u42")), false, always("401")},
		{"scope backup only", hs(claims("u42", apptoken.ClaimScopes, []string{"backup"})), false,
			subjectRule(func(rc routeCase) bool { return rc.name == "subject events" }, anyAction)},
		{"read only action", hs(claims("u42", apptoken.ClaimActions, []string{"read"})), false,
			subjectRule(every, func(a apptoken.Action) bool { return a == apptoken.ActionRead })},
		{"submit only action", hs(claims("u42", apptoken.ClaimActions, []string{"submit"})), false,
			subjectRule(every, func(a apptoken.Action) bool { return a == apptoken.ActionSubmit })},
		{"subject u42 in query", hs(claims("u42")), true, func(rc routeCase) string {
			if !isStreamPath(strings.Split(rc.path, "?")[0]) {
				return "401" // the query is read on the streams only
			}
			return subjectRule(every, anyAction)(rc)
		}},
		{"operator in query", opToken, true, func(rc routeCase) string {
			if !isStreamPath(strings.Split(rc.path, "?")[0]) {
				return "401"
			}
			return "ok"
		}},
	}
	var secrets []string
	for _, k := range kinds {
		if k.token != "" {
			secrets = append(secrets, k.token)
		}
	}
	for _, k := range kinds {
		for _, rc := range tokenRoutes {
			t.Run(k.name+"/"+rc.name, func(t *testing.T) {
				want := k.want(rc)
				path, hdr := rc.path, []string{}
				switch {
				case k.token != "" && k.query:
					sep := "?"
					if strings.Contains(path, "?") {
						sep = "&"
					}
					path += sep + "access_token=" + k.token
				case k.token != "":
					hdr = []string{"Authorization", "Bearer " + k.token}
				}
				beforeKeys, before := e.keys(), e.redisState()
				r := e.do(rc.method, path, rc.body, hdr...)
				switch want {
				case "ok":
					if r.status == 401 || r.status == 403 {
						t.Fatalf("refused: %d %s", r.status, r.raw)
					}
				case "401":
					mustStatus(t, r, 401, "unauthorized")
					e.mustUnchanged(t, beforeKeys, before)
				case "403":
					mustStatus(t, r, 403, "forbidden")
					e.mustUnchanged(t, beforeKeys, before)
				}
				for _, s := range secrets {
					if strings.Contains(string(r.raw), s) {
						t.Fatalf("the answer holds a token: %s", r.raw)
					}
				}
			})
		}
	}
	// No log line holds a token, whatever its level.
	e.logs.mu.Lock()
	defer e.logs.mu.Unlock()
	if len(e.logs.recs) == 0 {
		t.Fatal("no log records captured")
	}
	for _, rec := range e.logs.recs {
		line := rec.Message
		rec.Attrs(func(a slog.Attr) bool { line += " " + a.String(); return true })
		for _, s := range secrets {
			if strings.Contains(line, s) {
				t.Fatalf("log line holds a token: %s", line)
			}
		}
	}
}

// TestSubjectTokenForeignSubjectOwnRoutes: a token for u4 opens u4's own
// routes, never u42's (prefix) ones.
func TestSubjectTokenForeignSubjectOwnRoutes(t *testing.T) {
	e, _ := newTokenEnv(t, envOpts{})
	u4 := []string{"Authorization", "Bearer " + signHS(t, []byte(appSecret), claims("u4"))}
	mustStatus(t, e.do("POST", "/v1/tasks/u4/course_sync/runs", "", u4...), 200, "")
	before := e.redisState()
	mustStatus(t, e.do("POST", "/v1/tasks/u42/course_sync/runs", "", u4...), 403, "forbidden")
	mustStatus(t, e.do("POST", "/v1/hooks/foreground", `{"subject":"u42"}`, u4...), 403, "forbidden")
	if e.redisState() != before {
		t.Fatal("a refused request changed Redis")
	}
	r := e.do("GET", "/v1/tasks/u4/course_sync", "", u4...)
	mustStatus(t, r, 200, "")
	if r.body["subject"] != "u4" {
		t.Fatalf("view %s", r.raw)
	}
	// A token limited to some scopes must name them on the hook.
	lim := []string{"Authorization", "Bearer " + signHS(t, []byte(appSecret), claims("u4", apptoken.ClaimScopes, []string{"course_sync"}))}
	mustStatus(t, e.do("POST", "/v1/hooks/foreground", `{"subject":"u4"}`, lim...), 403, "forbidden")
	mustStatus(t, e.do("POST", "/v1/hooks/foreground", `{"subject":"u4","scopes":["course_sync"]}`, lim...), 200, "")
}

// TestSubjectStream: a subject stream sends its subject's current state
// first, then only its subject's changes, and ends when its token expires.
func TestSubjectStream(t *testing.T) {
	e, _ := newTokenEnv(t, envOpts{})
	op := []string{"Authorization", "Bearer " + opToken}
	mustStatus(t, e.do("POST", "/v1/tasks/u42/course_sync/runs", "", op...), 200, "")
	// Expires in 2-3 s (exp is whole seconds).
	tok := signHS(t, []byte(appSecret), claims("u42", "exp", time.Now().Add(3*time.Second).Unix()))
	s := openSSE(t, e.srv.Client(), e.srv.URL+"/v1/subjects/u42/events?access_token="+tok)
	isTask := func(m sseMsg) bool { return m.event == "task" }
	first := s.next(2*time.Second, "the current state", isTask)
	var v map[string]any
	if err := json.Unmarshal([]byte(first.data), &v); err != nil || v["subject"] != "u42" || v["scope"] != "course_sync" {
		t.Fatalf("first message %q (%v)", first.data, err)
	}
	// Another subject's changes (u4, a prefix of u42, and u420) never
	// arrive; u42's do.
	mustStatus(t, e.do("POST", "/v1/tasks/u4/course_sync/runs", "", op...), 200, "")
	mustStatus(t, e.do("POST", "/v1/tasks/u420/backup/runs", "", op...), 200, "")
	mustStatus(t, e.do("POST", "/v1/tasks/u42/backup/runs", "", op...), 200, "")
	for {
		m := s.next(2*time.Second, "u42's backup view", isTask)
		if err := json.Unmarshal([]byte(m.data), &v); err != nil {
			t.Fatal(err)
		}
		if v["subject"] != "u42" {
			t.Fatalf("stream of u42 got %s", m.data)
		}
		if v["scope"] == "backup" {
			break
		}
	}
	// The stream ends at the token's expiry, saying so.
	deadline := time.After(5 * time.Second)
	for {
		select {
		case m, open := <-s.msgs:
			if !open {
				t.Fatal("stream ended without the expiry comment")
			}
			if m.event == "task" {
				if err := json.Unmarshal([]byte(m.data), &v); err != nil || v["subject"] != "u42" {
					t.Fatalf("stream of u42 got %s", m.data)
				}
			}
			for _, c := range m.comments {
				if c == "token expired" {
					if _, open := <-s.msgs; open {
						t.Fatal("stream goes on after the expiry comment")
					}
					return
				}
			}
		case <-deadline:
			t.Fatal("stream outlived its token")
		}
	}
}

// TestSubjectStreamRefusesExpiredToken: a token past its exp but within
// the verification's leeway still opens the other routes, but not a
// stream, which would end at once: a client reconnecting with it would
// loop instead of getting a new one.
func TestSubjectStreamRefusesExpiredToken(t *testing.T) {
	e, _ := newTokenEnv(t, envOpts{})
	tok := signHS(t, []byte(appSecret), claims("u42", "exp", time.Now().Add(-apptoken.Leeway/2).Unix()))
	auth := []string{"Authorization", "Bearer " + tok}
	mustStatus(t, e.do("GET", "/v1/tasks/u42/course_sync", "", auth...), 404, "not_found")
	mustStatus(t, e.do("GET", "/v1/subjects/u42/events", "", auth...), 401, "unauthorized")
}

// TestSubjectStreamCap: subject streams have their own cap, apart from the
// operator feed's.
func TestSubjectStreamCap(t *testing.T) {
	e, _ := newTokenEnv(t, envOpts{maxSubjectStreams: 1, maxEventClients: 1})
	tok := signHS(t, []byte(appSecret), claims("u42"))
	openSSE(t, e.srv.Client(), e.srv.URL+"/v1/subjects/u42/events?access_token="+tok)
	r := e.do("GET", "/v1/subjects/u42/events", "", "Authorization", "Bearer "+tok)
	mustStatus(t, r, 503, "too_many_clients")
	if r.header.Get("Retry-After") == "" {
		t.Fatal("no Retry-After")
	}
	// The operator feed still has its slot.
	openSSE(t, e.srv.Client(), e.srv.URL+"/v1/events?access_token="+opToken)
}

// TestSubjectHubDeliversBySubject: the hub hands a view to its subject's
// streams only, through the map.
func TestSubjectHubDeliversBySubject(t *testing.T) {
	e := newEnv(t, envOpts{noServer: true})
	h := newSubjectHub(e.reg, slog.New(e.logs))
	var streams []*subjectStream
	for i := range 50 {
		s, err := h.join(t.Context(), fmt.Sprintf("u%d", i))
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, s)
	}
	if _, err := e.reg.Submit(t.Context(), "u7", "backup", jobs.SubmitOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case v := <-streams[7].views:
		if v.Subject != "u7" {
			t.Fatalf("u7's stream got %s", v.Key)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("u7's stream got nothing")
	}
	time.Sleep(50 * time.Millisecond)
	for i, s := range streams {
		if len(s.views) != 0 {
			t.Fatalf("stream of u%d got %d views", i, len(s.views))
		}
		h.leave(s)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.n != 0 || len(h.streams) != 0 || h.cancel != nil {
		t.Fatalf("hub not empty after every leave: n=%d streams=%d", h.n, len(h.streams))
	}
}

// FuzzSubjectAuthorization sends a fuzzed token and subject through the
// whole handler (authentication, routing, authorization) on the six
// subject routes and three operator routes. Whatever the inputs: no panic,
// no 5xx; a 200 means the token verified and, for a subject token, that the
// route is its own subject's; any other answer changes nothing; no answer
// quotes the token.
func FuzzSubjectAuthorization(f *testing.F) {
	good := signHS(f, []byte(appSecret), claims("u42"))
	for _, s := range []struct {
		token, subject string
		route          uint8
	}{
		{good, "u42", 0}, {good, "u4", 0}, {good, "u4", 1}, {good, "u420", 3}, {good, "u42%7Cx", 2}, {good, "u42%2Fx", 3}, {good, "U42", 4},
		{good, "u%342", 5}, {good, "u42", 6}, {good, "u42", 7}, {opToken, "u1", 0}, {readTok, "u1", 3},
		{good + "x", "u42", 1}, {apptokentest.Unsigned(claims("u42")), "u42", 0}, {"a.b.c", "u42", 0}, {"..", "", 2},
		{signHS(f, []byte(appSecret), claims("u42", "exp", 0)), "u42", 0},
	} {
		f.Add(s.token, s.subject, s.route)
	}
	v, err := apptoken.NewVerifier(f.Context(), apptoken.Config{HMACSecret: appSecret, Issuer: appIssuer, Audience: appAudence})
	if err != nil {
		f.Fatal(err)
	}
	e := newEnv(f, envOpts{token: opToken, readToken: readTok, subjects: v, noServer: true, noMetrics: true})
	f.Fuzz(func(t *testing.T, token, subject string, route uint8) {
		if strings.ContainsAny(token, "\r\n\x00") || strings.ContainsFunc(subject, func(r rune) bool {
			return r <= ' ' || r >= 0x7f || strings.ContainsRune("/?#\\", r)
		}) {
			return // not a header value, or not one path segment
		}
		var method, target, body string
		switch route % 8 {
		case 0:
			method, target = "POST", "/v1/tasks/"+subject+"/course_sync/runs"
		case 1:
			method, target = "GET", "/v1/tasks/"+subject+"/course_sync"
		case 2:
			method, target = "GET", "/v1/tasks/"+subject+"/course_sync/history"
		case 3:
			method, target = "POST", "/v1/tasks/"+subject+"/course_sync/cancel"
		case 4:
			b, _ := json.Marshal(map[string]any{"subject": subject, "scopes": []string{"course_sync"}})
			method, target, body = "POST", "/v1/hooks/foreground", string(b)
		case 5:
			method, target = "GET", "/v1/tasks?subject=u42"
		case 6:
			method, target = "POST", "/v1/scopes/course_sync/pause"
		case 7:
			method, target = "GET", "/v1/runners"
		}
		if _, err := url.ParseRequestURI(target); err != nil {
			return
		}
		var rd io.Reader
		if body != "" {
			rd = strings.NewReader(body)
		}
		req := httptest.NewRequest(method, target, rd)
		req.Host = testHost
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		req.Header.Set("Authorization", "Bearer "+token)
		before := e.redisState()
		w := httptest.NewRecorder()
		e.h.ServeHTTP(w, req)
		if w.Code >= 500 {
			t.Fatalf("%s %s: %d %s", method, target, w.Code, w.Body)
		}
		if strings.TrimSpace(token) != "" && len(token) > 3 && strings.Contains(w.Body.String(), strings.TrimSpace(token)) {
			t.Fatalf("answer quotes the token: %s", w.Body)
		}
		if w.Code != http.StatusOK {
			// Refused (401, 403), or not routed or bad input (404, 400,
			// a redirect): nothing may have changed.
			if e.redisState() != before {
				t.Fatalf("%s %s answered %d but changed Redis", method, target, w.Code)
			}
			return
		}
		tok := strings.TrimSpace(token)
		if tok == opToken || tok == readTok && method == "GET" {
			return
		}
		if tok == readTok {
			t.Fatalf("read-only token served %s %s: %d", method, target, w.Code)
		}
		g, err := v.Verify(tok)
		if err != nil {
			t.Fatalf("%s %s served (%d) with a token that does not verify: %v", method, target, w.Code, err)
		}
		if route%8 >= 5 {
			t.Fatalf("subject token served operator route %s %s: %d", method, target, w.Code)
		}
		// The mux unescapes the segment; the subject served must be g's.
		served := subject
		if route%8 != 4 {
			if s, err := url.PathUnescape(subject); err == nil {
				served = s
			}
		}
		if served != g.Subject {
			t.Fatalf("token of %q served subject %q: %s %s %d %s", g.Subject, served, method, target, w.Code, w.Body)
		}
	})
}
