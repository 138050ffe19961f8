package httpapi

import (
	"context"
	"io"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Tests of the browser defences (browser.go, DESIGN §5): cross-site
// refusal, CORS for listed origins, JSON-only POST bodies, the Host
// allow-list without a token, and the SSE client cap.

// redisState is everything in Redis, to prove a refused request wrote
// nothing (keys alone miss a changed hash field).
func (e *env) redisState() string { return e.mini.Dump() }

// mustUnchanged fails if Redis differs from before.
func (e *env) mustUnchanged(t *testing.T, beforeKeys []string, beforeDump string) {
	t.Helper()
	if after := e.keys(); !slices.Equal(beforeKeys, after) {
		t.Fatalf("redis keys changed:\nbefore %v\nafter  %v", beforeKeys, after)
	}
	if after := e.redisState(); after != beforeDump {
		t.Fatalf("redis content changed:\nbefore %s\nafter  %s", beforeDump, after)
	}
}

func TestCrossSiteRequestsRefused(t *testing.T) {
	e := newEnv(t, envOpts{})
	mustStatus(t, e.do("POST", "/v1/tasks/u1/course_sync/runs", ""), 200, "")
	self := e.srv.URL // http://127.0.0.1:port
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(self, "http://"))
	for _, tc := range []struct {
		name, method, path, body string
		hdr                      []string
	}{
		// The attack of the task: a cross-site form (text/plain) cancels.
		{"form cancel", "POST", "/v1/tasks/u1/course_sync/cancel", "x=1",
			[]string{"Content-Type", "text/plain", "Origin", "https://evil.example", "Sec-Fetch-Site", "cross-site"}},
		// An older browser: Origin but no Sec-Fetch-Site.
		{"origin only", "POST", "/v1/tasks/u1/course_sync/cancel", "",
			[]string{"Origin", "https://evil.example"}},
		// An empty form body passes the JSON rule; the origin check stops it.
		{"empty form submit", "POST", "/v1/tasks/u9/course_sync/runs", "",
			[]string{"Content-Type", "application/x-www-form-urlencoded", "Origin", "https://evil.example", "Sec-Fetch-Site", "cross-site"}},
		{"fetch site only", "POST", "/v1/tasks/u1/course_sync/cancel", "", []string{"Sec-Fetch-Site", "cross-site"}},
		// Another port of localhost is same-site, and still another app.
		{"same-site", "POST", "/v1/tasks/u1/course_sync/cancel", "",
			[]string{"Origin", "http://127.0.0.1:3000", "Sec-Fetch-Site", "same-site"}},
		{"other port, no fetch metadata", "POST", "/v1/tasks/u1/course_sync/cancel", "", []string{"Origin", "http://127.0.0.1:1"}},
		{"other scheme", "POST", "/v1/tasks/u1/course_sync/cancel", "", []string{"Origin", "https://127.0.0.1:" + port}},
		{"localhost is not 127.0.0.1", "POST", "/v1/tasks/u1/course_sync/cancel", "", []string{"Origin", "http://localhost:" + port}},
		{"opaque origin", "POST", "/v1/tasks/u1/course_sync/cancel", "", []string{"Origin", "null"}},
		{"garbage origin", "POST", "/v1/tasks/u1/course_sync/cancel", "", []string{"Origin", "127.0.0.1:" + port}},
		// Origin says same-origin, but a cross-site hop (redirect) led here.
		{"same origin via cross-site redirect", "POST", "/v1/tasks/u1/course_sync/cancel", "",
			[]string{"Origin", self, "Sec-Fetch-Site", "cross-site"}},
		{"unknown fetch site", "POST", "/v1/tasks/u1/course_sync/cancel", "", []string{"Sec-Fetch-Site", "cross-planet"}},
		// Reads are refused too: a cross-site page must not read tasks.
		{"list", "GET", "/v1/tasks", "", []string{"Sec-Fetch-Site", "cross-site"}},
		{"get", "GET", "/v1/tasks/u1/course_sync", "", []string{"Origin", "https://evil.example"}},
		{"history", "GET", "/v1/tasks/u1/course_sync/history", "", []string{"Origin", "https://evil.example", "Sec-Fetch-Site", "cross-site"}},
		{"events", "GET", "/v1/events", "", []string{"Origin", "https://evil.example", "Sec-Fetch-Site", "cross-site"}},
		{"hook", "POST", "/v1/hooks/foreground", "", []string{"Origin", "https://evil.example"}},
		{"unknown v1 route", "GET", "/v1/nope", "", []string{"Sec-Fetch-Site", "cross-site"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			keys, dump := e.keys(), e.redisState()
			r := e.do(tc.method, tc.path, tc.body, tc.hdr...)
			mustStatus(t, r, http.StatusForbidden, "forbidden")
			if msg := r.body["error"].(map[string]any)["message"].(string); !strings.Contains(msg, "http.allowedOrigins") {
				t.Errorf("message does not say how to allow an origin: %q", msg)
			}
			if h := r.header.Get("Access-Control-Allow-Origin"); h != "" {
				t.Errorf("refused request answered Access-Control-Allow-Origin %q", h)
			}
			e.mustUnchanged(t, keys, dump)
		})
	}
	if v := e.do("GET", "/v1/tasks/u1/course_sync", "").body; v["status"] != "queued" {
		t.Fatalf("the run was touched: %v", v)
	}
	// Not /v1: a link to the dashboard from another site still opens it.
	mustStatus(t, e.do("GET", "/", "", "Sec-Fetch-Site", "cross-site"), 200, "")
}

func TestSameOriginAndNonBrowserRequests(t *testing.T) {
	e := newEnv(t, envOpts{})
	self := e.srv.URL
	hostPort := strings.TrimPrefix(self, "http://")
	for _, tc := range []struct {
		name, method, path, body string
		hdr                      []string
	}{
		// The dashboard's fetch: Origin on POST, Sec-Fetch-Site always.
		{"dashboard submit", "POST", "/v1/tasks/u1/course_sync/runs", `{"source":"manual"}`,
			[]string{"Origin", self, "Sec-Fetch-Site", "same-origin"}},
		{"dashboard cancel", "POST", "/v1/tasks/u1/course_sync/cancel", "", []string{"Origin", self, "Sec-Fetch-Site", "same-origin"}},
		{"dashboard list", "GET", "/v1/tasks", "", []string{"Sec-Fetch-Site", "same-origin"}},
		{"typed in the address bar", "GET", "/v1/tasks", "", []string{"Sec-Fetch-Site", "none"}},
		{"origin case", "GET", "/v1/tasks", "", []string{"Origin", "HTTP://" + hostPort}},
		{"default port", "GET", "/v1/tasks", "", []string{"Host", "localhost", "Origin", "http://localhost:80"}},
		{"behind a TLS proxy", "POST", "/v1/tasks/u2/course_sync/runs", "",
			[]string{"Origin", "https://" + hostPort, "X-Forwarded-Proto", "https", "Sec-Fetch-Site", "same-origin"}},
		{"curl", "POST", "/v1/tasks/u3/course_sync/runs", `{}`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.do(tc.method, tc.path, tc.body, tc.hdr...)
			mustStatus(t, r, http.StatusOK, "")
			if h := r.header.Get("Access-Control-Allow-Origin"); h != "" {
				t.Errorf("same-origin answer has Access-Control-Allow-Origin %q", h)
			}
			if v := r.header.Values("Vary"); slices.Contains(v, "Origin") {
				t.Errorf("Vary: Origin without allowed origins: %v", v)
			}
		})
	}
}

func TestAllowedOrigins(t *testing.T) {
	const dash = "https://dash.example.com"
	e := newEnv(t, envOpts{allowedOrigins: []string{dash, "HTTP://LOCALHOST:3000"}})
	checkCORS := func(t *testing.T, r response, origin string) {
		t.Helper()
		if got := r.header.Get("Access-Control-Allow-Origin"); got != origin {
			t.Errorf("Access-Control-Allow-Origin %q, want %q", got, origin)
		}
		if !slices.Contains(r.header.Values("Vary"), "Origin") {
			t.Errorf("no Vary: Origin: %v", r.header)
		}
		if r.header.Get("Access-Control-Allow-Credentials") != "" {
			t.Error("credentials allowed: the API has no cookies to share")
		}
	}

	r := e.do("GET", "/v1/tasks", "", "Origin", dash, "Sec-Fetch-Site", "cross-site")
	mustStatus(t, r, 200, "")
	checkCORS(t, r, dash)
	r = e.do("POST", "/v1/tasks/u1/course_sync/runs", `{"source":"manual"}`, "Origin", dash, "Sec-Fetch-Site", "cross-site")
	mustStatus(t, r, 200, "")
	checkCORS(t, r, dash)
	// Listed in another case and with the default port: normalized.
	r = e.do("GET", "/v1/tasks", "", "Origin", "http://localhost:3000", "Sec-Fetch-Site", "same-site")
	mustStatus(t, r, 200, "")
	checkCORS(t, r, "http://localhost:3000")
	// A request without Origin still varies by it when origins are listed.
	if r = e.do("GET", "/v1/tasks", ""); !slices.Contains(r.header.Values("Vary"), "Origin") {
		t.Errorf("no Vary: Origin on a plain answer: %v", r.header)
	}

	// Preflight of the page's JSON POST.
	r = e.do("OPTIONS", "/v1/tasks/u1/course_sync/runs", "", "Origin", dash, "Sec-Fetch-Site", "cross-site",
		"Access-Control-Request-Method", "POST", "Access-Control-Request-Headers", "authorization,content-type")
	if r.status != http.StatusNoContent || len(r.raw) != 0 {
		t.Fatalf("preflight: %d %s", r.status, r.raw)
	}
	checkCORS(t, r, dash)
	if m := r.header.Get("Access-Control-Allow-Methods"); m != "GET, POST" {
		t.Errorf("Allow-Methods %q", m)
	}
	if h := r.header.Get("Access-Control-Allow-Headers"); h != "Authorization, Content-Type" {
		t.Errorf("Allow-Headers %q", h)
	}
	if r.header.Get("Access-Control-Allow-Private-Network") != "" {
		t.Error("Allow-Private-Network without the request header")
	}
	r = e.do("OPTIONS", "/v1/events", "", "Origin", dash, "Access-Control-Request-Method", "GET",
		"Access-Control-Request-Private-Network", "true")
	if r.status != http.StatusNoContent || r.header.Get("Access-Control-Allow-Private-Network") != "true" {
		t.Fatalf("private network preflight: %d %v", r.status, r.header)
	}

	// Unlisted and look-alike origins: 403, preflight or not.
	for _, o := range []string{"https://evil.example", "http://dash.example.com", "https://dash.example.com.evil.example",
		"https://dash.example.com:8443", "https://evil.dash.example.com", dash + "/", "null"} {
		keys, dump := e.keys(), e.redisState()
		r = e.do("OPTIONS", "/v1/tasks/u1/course_sync/runs", "", "Origin", o, "Access-Control-Request-Method", "POST")
		mustStatus(t, r, http.StatusForbidden, "forbidden")
		if r.header.Get("Access-Control-Allow-Origin") != "" || r.header.Get("Access-Control-Allow-Methods") != "" {
			t.Errorf("unlisted preflight from %q got CORS headers: %v", o, r.header)
		}
		mustStatus(t, e.do("POST", "/v1/tasks/u1/course_sync/cancel", "", "Origin", o), http.StatusForbidden, "forbidden")
		e.mustUnchanged(t, keys, dump)
	}
	// OPTIONS without a preflight is not a route.
	mustStatus(t, e.do("OPTIONS", "/v1/tasks", ""), http.StatusMethodNotAllowed, "method_not_allowed")
}

// TestAllowedOriginWithToken: the preflight carries no token and must pass;
// the real request needs it, and its 401 is readable by the listed page.
func TestAllowedOriginWithToken(t *testing.T) {
	const dash = "https://dash.example.com"
	e := newEnv(t, envOpts{token: "s3cret", allowedOrigins: []string{dash}})
	r := e.do("OPTIONS", "/v1/tasks", "", "Origin", dash, "Access-Control-Request-Method", "GET",
		"Access-Control-Request-Headers", "authorization")
	if r.status != http.StatusNoContent {
		t.Fatalf("preflight with a token configured: %d %s", r.status, r.raw)
	}
	r = e.do("GET", "/v1/tasks", "", "Origin", dash)
	mustStatus(t, r, 401, "unauthorized")
	if r.header.Get("Access-Control-Allow-Origin") != dash {
		t.Errorf("401 to a listed origin without CORS headers: %v", r.header)
	}
	mustStatus(t, e.do("GET", "/v1/tasks", "", "Origin", dash, "Authorization", "Bearer s3cret"), 200, "")
	// A foreign origin is refused before the token is looked at.
	mustStatus(t, e.do("GET", "/v1/tasks", "", "Origin", "https://evil.example", "Authorization", "Bearer s3cret"), 403, "forbidden")
}

func TestPostBodiesMustBeJSON(t *testing.T) {
	e := newEnv(t, envOpts{})
	mustStatus(t, e.do("POST", "/v1/tasks/u1/backup/runs", ""), 200, "")
	for _, tc := range []struct{ name, path, body, ct string }{
		{"text/plain", "/v1/tasks/u1/course_sync/runs", `{}`, "text/plain"},
		{"text/plain charset", "/v1/tasks/u1/course_sync/runs", `{}`, "text/plain; charset=utf-8"},
		{"form", "/v1/tasks/u1/course_sync/runs", `source=manual`, "application/x-www-form-urlencoded"},
		{"multipart", "/v1/hooks/foreground", `{"subject":"u1"}`, "multipart/form-data; boundary=x"},
		{"no content type", "/v1/tasks/u1/course_sync/runs", `{}`, ""},
		{"json lookalike", "/v1/tasks/u1/course_sync/runs", `{}`, "application/json-seq"},
		{"cancel with a body", "/v1/tasks/u1/backup/cancel", `x`, "text/plain"},
		{"unknown route", "/v1/nope", `{}`, "text/plain"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			keys, dump := e.keys(), e.redisState()
			r := e.do("POST", tc.path, tc.body, "Content-Type", tc.ct)
			mustStatus(t, r, http.StatusUnsupportedMediaType, "unsupported_media_type")
			if msg := r.body["error"].(map[string]any)["message"].(string); !strings.Contains(msg, "application/json") {
				t.Errorf("message does not name the type to send: %q", msg)
			}
			e.mustUnchanged(t, keys, dump)
		})
	}

	// A chunked body (no Content-Length) is a body too.
	req, _ := http.NewRequest("POST", e.srv.URL+"/v1/tasks/u1/course_sync/runs", io.MultiReader(strings.NewReader(`{}`)))
	req.Header.Set("Content-Type", "text/plain")
	res, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusUnsupportedMediaType {
		t.Fatalf("chunked text/plain body: %d", res.StatusCode)
	}

	for _, ct := range []string{"application/json", "application/json; charset=utf-8", "Application/JSON", "application/json;charset=UTF-8"} {
		mustStatus(t, e.do("POST", "/v1/tasks/u2/course_sync/runs", `{"source":"manual"}`, "Content-Type", ct), 200, "")
	}
	// No body (curl -X POST): any Content-Type, or none.
	for _, ct := range []string{"", "text/plain", "application/x-www-form-urlencoded"} {
		mustStatus(t, e.do("POST", "/v1/tasks/u1/backup/cancel", "", "Content-Type", ct), 200, "")
	}
	// Not /v1: the usual 405, not 415.
	mustStatus(t, e.do("POST", "/healthz", "x", "Content-Type", "text/plain"), http.StatusMethodNotAllowed, "method_not_allowed")

	// With a token, a wrong token is 401 before the media type is looked at.
	te := newEnv(t, envOpts{token: "s3cret"})
	mustStatus(t, te.do("POST", "/v1/tasks/u1/backup/runs", "x", "Content-Type", "text/plain"), 401, "unauthorized")
	mustStatus(t, te.do("POST", "/v1/tasks/u1/backup/runs", "x", "Content-Type", "text/plain", "Authorization", "Bearer s3cret"),
		http.StatusUnsupportedMediaType, "unsupported_media_type")
}

func TestHostAllowListWithoutToken(t *testing.T) {
	e := newEnv(t, envOpts{})
	mustStatus(t, e.do("POST", "/v1/tasks/u1/course_sync/runs", ""), 200, "")
	for _, host := range []string{
		"evil.example:8080", "evil.example", "localhost.evil.example", "127.0.0.1.nip.io", "evil-localhost",
		"[::2]:8080", "0x7f000001", "10.0.0.5:8080", "0.0.0.0:8080", "[::]:8080", "localhost:bad", "[::1",
	} {
		t.Run(host, func(t *testing.T) {
			keys, dump := e.keys(), e.redisState()
			for _, rq := range []struct{ method, path string }{
				{"GET", "/v1/tasks"}, {"POST", "/v1/tasks/u1/course_sync/cancel"}, {"GET", "/v1/events"},
				{"GET", "/"}, {"GET", "/v1/nope"},
			} {
				r := e.do(rq.method, rq.path, "", "Host", host)
				mustStatus(t, r, http.StatusForbidden, "forbidden")
				if msg := r.body["error"].(map[string]any)["message"].(string); !strings.Contains(msg, "http.token") || !strings.Contains(msg, "DNS rebinding") {
					t.Errorf("message does not say why and how to fix: %q", msg)
				}
			}
			e.mustUnchanged(t, keys, dump)
			// Probes answer whatever the Host (pod IPs, load balancers).
			for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
				mustStatus(t, e.do("GET", p, "", "Host", host), 200, "")
			}
		})
	}
	for _, host := range []string{
		"127.0.0.1:8080", "localhost:8080", "[::1]:8080", "localhost", "LOCALHOST:8080", "localhost.:8080",
		"127.0.0.2", "app.localhost:3000", "[::ffff:127.0.0.1]:8080",
	} {
		mustStatus(t, e.do("GET", "/v1/tasks", "", "Host", host), 200, "")
		mustStatus(t, e.do("GET", "/", "", "Host", host), 200, "")
	}

	// Configured extra hosts (cmd/runner: the listen host and the hosts of
	// allowedOrigins), port ignored.
	x := newEnv(t, envOpts{allowedHosts: []string{"runner.internal", "192.168.1.5:8080", "[fd00::1]"}})
	for _, host := range []string{"runner.internal:8080", "RUNNER.internal", "192.168.1.5:9", "[fd00::1]:8080"} {
		mustStatus(t, x.do("GET", "/v1/tasks", "", "Host", host), 200, "")
	}
	for _, host := range []string{"evil.example:8080", "runner.internal.evil.example", "192.168.1.6:8080"} {
		mustStatus(t, x.do("GET", "/v1/tasks", "", "Host", host), 403, "forbidden")
	}
}

// TestHostAllowListOffWithToken: the token protects the API whatever the
// Host (a browser never attaches it by itself).
func TestHostAllowListOffWithToken(t *testing.T) {
	e := newEnv(t, envOpts{token: "s3cret"})
	mustStatus(t, e.do("GET", "/v1/tasks", "", "Host", "evil.example:8080", "Authorization", "Bearer s3cret"), 200, "")
	mustStatus(t, e.do("POST", "/v1/tasks/u1/backup/runs", "", "Host", "10.0.0.5:8080", "Authorization", "Bearer s3cret"), 200, "")
	mustStatus(t, e.do("GET", "/v1/tasks", "", "Host", "evil.example:8080"), 401, "unauthorized")
	mustStatus(t, e.do("GET", "/", "", "Host", "evil.example:8080"), 200, "")
}

// openStream opens GET /v1/events and returns the response and a func that
// closes it (the client goes away).
func openStream(t *testing.T, e *env, hdr ...string) (*http.Response, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, "GET", e.srv.URL+"/v1/events", nil)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	res, err := e.srv.Client().Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	closeFn := func() { cancel(); res.Body.Close() }
	t.Cleanup(closeFn)
	return res, closeFn
}

func TestEventsClientCap(t *testing.T) {
	e := newEnv(t, envOpts{maxEventClients: 2})
	a, closeA := openStream(t, e)
	b, _ := openStream(t, e)
	if a.StatusCode != 200 || b.StatusCode != 200 {
		t.Fatalf("first two streams: %d, %d", a.StatusCode, b.StatusCode)
	}
	third := e.do("GET", "/v1/events", "")
	mustStatus(t, third, http.StatusServiceUnavailable, "too_many_clients")
	if ra := third.header.Get("Retry-After"); ra != "5" {
		t.Errorf("Retry-After %q, want 5", ra)
	}
	if msg := third.body["error"].(map[string]any)["message"].(string); !strings.Contains(msg, "at most 2") || !strings.Contains(msg, "http.maxEventClients") {
		t.Errorf("message does not name the limit: %q", msg)
	}
	// Other routes are not limited.
	mustStatus(t, e.do("GET", "/v1/tasks", ""), 200, "")

	// A stream that ends frees its slot: poll until a new one is admitted.
	closeA()
	var c *http.Response
	waitFor(t, 5*time.Second, "a slot after a stream ended", func() bool {
		res, closeRes := openStream(t, e)
		if res.StatusCode == 200 {
			c = res
			return true
		}
		closeRes()
		return false
	})
	if c == nil {
		t.Fatal("no stream")
	}
	// Full again: two open (b and c).
	mustStatus(t, e.do("GET", "/v1/events", ""), http.StatusServiceUnavailable, "too_many_clients")
	if n := e.h.(*api).openEvents.Load(); n != 2 {
		t.Fatalf("open event streams %d, want 2", n)
	}
}

// TestEventsCapDefaultAndAuth: the default is MaxEventClientsDefault, and
// unauthenticated requests never take a slot.
func TestEventsCapDefaultAndAuth(t *testing.T) {
	if a := newEnv(t, envOpts{noServer: true}).h.(*api); a.maxEvents != MaxEventClientsDefault || MaxEventClientsDefault != 100 {
		t.Fatalf("default cap %d", a.maxEvents)
	}
	e := newEnv(t, envOpts{token: "s3cret", maxEventClients: 1})
	res, _ := openStream(t, e, "Authorization", "Bearer s3cret")
	if res.StatusCode != 200 {
		t.Fatalf("stream: %d", res.StatusCode)
	}
	mustStatus(t, e.do("GET", "/v1/events", ""), 401, "unauthorized")
	mustStatus(t, e.do("GET", "/v1/events", "", "Authorization", "Bearer s3cret"), 503, "too_many_clients")
}

func TestParseOrigin(t *testing.T) {
	for in, want := range map[string]string{
		"https://dash.example.com":     "https://dash.example.com",
		"HTTPS://Dash.Example.COM:443": "https://dash.example.com",
		"http://localhost:80":          "http://localhost",
		"http://localhost:3000":        "http://localhost:3000",
		"https://example.com:80":       "https://example.com:80",
		"http://[::1]:8080":            "http://[::1]:8080",
		"http://[0:0::1]":              "http://[::1]",
		"http://127.0.0.1:08080":       "http://127.0.0.1:8080",
	} {
		if got, err := ParseOrigin(in); err != nil || got != want {
			t.Errorf("ParseOrigin(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{
		"", "*", "https://*.example.com", "https://example.com/", "https://example.com/app", "https://example.com?x",
		"https://example.com#x", "https://u:p@example.com", "ftp://example.com", "example.com", "//example.com",
		"https://", "https://:443", "https://example.com:0", "https://example.com:65536", "https://example.com:x",
		"https://exa mple.com", "https://exämple.com", "http://[::1", "http://[fe80::1%eth0]", "http://[127.0.0.1]",
		"http://::1", "null", "https://example.com:+1",
	} {
		if got, err := ParseOrigin(in); err == nil {
			t.Errorf("ParseOrigin(%q) = %q, want an error", in, got)
		}
	}
	for _, in := range []string{"*", "https://*.example.com", "http://localhost:*"} {
		if _, err := ParseOrigin(in); err == nil || !strings.Contains(err.Error(), "wildcards are not allowed") {
			t.Errorf("ParseOrigin(%q) = %v, want the wildcard explained", in, err)
		}
	}
}

// fuzzOrigins and fuzzHosts configure the guard the fuzz target checks.
var (
	fuzzOrigins = []string{"https://dash.example.com", "http://localhost:3000", "http://[::1]:9000"}
	fuzzHosts   = []string{"runner.internal"}
)

// FuzzBrowserChecks feeds arbitrary request facts to the browser checks:
// they must never panic, and whatever they admit must be same-origin or a
// listed origin, addressed to a loopback or listed host (without a token),
// and, for a POST with a body, declared JSON. The oracles parse with
// net/url and net rather than with browser.go's own parser.
func FuzzBrowserChecks(f *testing.F) {
	seeds := []struct {
		method, path, host, origin, site, ct, xfp string
		n                                         int64
		tls, token                                bool
	}{
		{"POST", "/v1/tasks/u1/course_sync/cancel", "127.0.0.1:8080", "https://evil.example", "cross-site", "text/plain", "", 3, false, false},
		{"POST", "/v1/tasks/u1/course_sync/runs", "127.0.0.1:8080", "http://127.0.0.1:8080", "same-origin", "application/json", "", 2, false, false},
		{"GET", "/v1/tasks", "localhost:8080", "", "same-site", "", "", 0, false, false},
		{"GET", "/v1/events", "evil.example:8080", "http://evil.example:8080", "same-origin", "", "", 0, false, false},
		{"GET", "/v1/events", "evil.example:8080", "http://evil.example:8080", "same-origin", "", "", 0, false, true},
		{"OPTIONS", "/v1/tasks", "127.0.0.1:8080", "https://dash.example.com", "cross-site", "", "", 0, false, false},
		{"OPTIONS", "/v1/tasks", "127.0.0.1:8080", "https://DASH.example.com:443", "cross-site", "", "", 0, false, false},
		{"POST", "/v1/hooks/foreground", "[::1]:8080", "http://[::1]:8080", "", "application/json; charset=utf-8", "", -1, false, false},
		{"POST", "/v1/hooks/foreground", "runner.internal", "https://runner.internal", "", "Application/Json", "https", 10, false, false},
		{"POST", "/v1/tasks/a/b/runs", "runner.internal:443", "https://runner.internal", "", "application/json ", "", 10, true, false},
		{"GET", "/", "evil.example", "", "", "", "", 0, false, false},
		{"GET", "/healthz", "evil.example", "https://evil.example", "cross-site", "", "", 0, false, false},
		{"POST", "/v1", "127.0.0.1", "null", "", "text/plain", "", 1, false, false},
		{"GET", "/v1/tasks", "127.0.0.1.", "http://127.0.0.1.", "", "", "", 0, false, false},
		{"GET", "/v1/tasks", "app.localhost", "http://app.localhost:80", "none", "", "", 0, false, false},
		{"POST", "/v1/x", "127.0.0.1:8080", "http://127.0.0.1:8080/", "", "application/json", "", 1, false, false},
		{"GET", "/v1/tasks", "[::ffff:127.0.0.1]:1", "http://[::ffff:7f00:1]:1", "", "", "", 0, false, false},
	}
	for _, s := range seeds {
		f.Add(s.method, s.path, s.host, s.origin, s.site, s.ct, s.xfp, s.n, s.tls, s.token)
	}
	f.Fuzz(func(t *testing.T, method, path, host, origin, site, ct, xfp string, n int64, tls, token bool) {
		g, errs := newGuard(Options{Token: map[bool]string{true: "t"}[token], AllowedOrigins: fuzzOrigins, AllowedHosts: fuzzHosts})
		if len(errs) != 0 {
			t.Fatal(errs)
		}
		fa := reqFacts{method: method, path: path, host: host, tls: tls, forwardedProto: xfp, origin: origin,
			fetchSite: site, contentType: ct, contentLength: n}
		if method == http.MethodOptions {
			fa.preflightFor = "POST"
		}
		v := g.admit(fa)
		switch v.status {
		case 0:
		case http.StatusForbidden:
			if v.code != "forbidden" || v.msg == "" || v.allowOrigin != "" || v.preflight {
				t.Fatalf("403 verdict %+v", v)
			}
			return
		default:
			t.Fatalf("status %d", v.status)
		}

		probe := path == "/healthz" || path == "/readyz" || path == "/metrics"
		if !token && !probe && !oracleLoopbackOrListed(host) {
			t.Fatalf("admitted Host %q without a token", host)
		}
		api := path == "/v1" || strings.HasPrefix(path, "/v1/")
		listed := oracleListed(origin)
		if v.allowOrigin != "" && (!api || !listed || v.allowOrigin != strings.TrimSpace(origin)) {
			t.Fatalf("Access-Control-Allow-Origin %q for origin %q on %q", v.allowOrigin, origin, path)
		}
		if v.preflight && (v.allowOrigin == "" || method != http.MethodOptions) {
			t.Fatalf("preflight verdict %+v for %s", v, method)
		}
		if api && !listed {
			if o := strings.TrimSpace(origin); o != "" && !oracleSameOrigin(o, host, tls, xfp) {
				t.Fatalf("admitted cross-origin %q to Host %q (tls %v, proto %q)", origin, host, tls, xfp)
			}
			if s := strings.ToLower(strings.TrimSpace(site)); s != "" && s != "same-origin" && s != "none" {
				t.Fatalf("admitted Sec-Fetch-Site %q from unlisted origin %q", site, origin)
			}
		}

		if msg := jsonBodyProblem(fa); msg == "" && api && method == http.MethodPost && n != 0 {
			mt, _, err := mime.ParseMediaType(ct)
			if (err == nil || err == mime.ErrInvalidMediaParameter) && mt != "application/json" {
				t.Fatalf("accepted a POST body of type %q (%q)", mt, ct)
			}
			if err != nil && err != mime.ErrInvalidMediaParameter && !strings.HasPrefix(strings.ToLower(strings.TrimSpace(ct)), "application/json") {
				t.Fatalf("accepted a POST body of type %q", ct)
			}
		} else if msg != "" && !strings.Contains(msg, "application/json") {
			t.Fatalf("415 message %q", msg)
		}
	})
}

// oracleOrigin splits an origin or a scheme plus Host with net/url, port
// made numeric and the default one dropped, IPs in canonical form.
func oracleOrigin(s string) (string, bool) {
	u, err := url.Parse(s)
	if err != nil || u.Opaque != "" || u.User != nil || u.Path != "" || u.RawQuery != "" || u.Fragment != "" || u.Host == "" {
		return "", false
	}
	scheme, host, port := strings.ToLower(u.Scheme), strings.ToLower(u.Hostname()), u.Port()
	if a, err := netip.ParseAddr(host); err == nil {
		host = a.String()
	}
	if port != "" {
		p, err := strconv.Atoi(port)
		if err != nil {
			return "", false
		}
		port = strconv.Itoa(p)
	}
	if scheme == "http" && port == "80" || scheme == "https" && port == "443" {
		port = ""
	}
	return scheme + "|" + host + "|" + port, true
}

func oracleListed(origin string) bool {
	o, ok := oracleOrigin(strings.TrimSpace(origin))
	if !ok {
		return false
	}
	for _, l := range fuzzOrigins {
		if lo, _ := oracleOrigin(l); lo == o {
			return true
		}
	}
	return false
}

func oracleSameOrigin(origin, host string, tls bool, xfp string) bool {
	scheme := "http"
	if tls || strings.EqualFold(strings.TrimSpace(strings.Split(xfp, ",")[0]), "https") {
		scheme = "https"
	}
	a, ok1 := oracleOrigin(origin)
	b, ok2 := oracleOrigin(scheme + "://" + host)
	return ok1 && ok2 && a == b
}

func oracleLoopbackOrListed(host string) bool {
	h := host
	if hh, _, err := net.SplitHostPort(host); err == nil {
		h = hh
	} else {
		h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	}
	h = strings.TrimSuffix(strings.ToLower(h), ".")
	if h == "localhost" || strings.HasSuffix(h, ".localhost") || slices.Contains(fuzzHosts, h) {
		return true
	}
	ip := net.ParseIP(h)
	return ip != nil && ip.IsLoopback()
}
