package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tasklease/tasklease/internal/apptoken"
)

const testSecret = "0123456789abcdef0123456789abcdef-example"

// testClient is a browser's cookie jar on an httptest server of the
// backend.
type testClient struct {
	t    *testing.T
	base string
	c    *http.Client
}

func newTestBackend(t *testing.T) (*server, *testClient) {
	t.Helper()
	s, err := newServer(config{Secret: testSecret, RunnerURL: "http://127.0.0.1:8080/"})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(s)
	t.Cleanup(ts.Close)
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return s, &testClient{t: t, base: ts.URL, c: &http.Client{Jar: jar}}
}

// do sends a request and decodes a JSON answer into out (when not nil).
func (c *testClient) do(method, path, contentType, body string, out any) int {
	c.t.Helper()
	req, err := http.NewRequest(method, c.base+path, strings.NewReader(body))
	if err != nil {
		c.t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.c.Do(req)
	if err != nil {
		c.t.Fatal(err)
	}
	defer resp.Body.Close()
	if out != nil && resp.StatusCode < 300 {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			c.t.Fatalf("%s %s: %v", method, path, err)
		}
	}
	return resp.StatusCode
}

func (c *testClient) login(user string) int {
	return c.do("POST", "/login", "application/json", `{"user":"`+user+`"}`, nil)
}

type tokenAnswer struct {
	Token, Subject, ExpiresAt string
}

func (c *testClient) token() (tokenAnswer, int) {
	var a tokenAnswer
	code := c.do("GET", "/token", "", "", &a)
	return a, code
}

func verify(t *testing.T, token string) apptoken.Grant {
	t.Helper()
	v, err := apptoken.NewVerifier(context.Background(), apptoken.Config{HMACSecret: testSecret})
	if err != nil {
		t.Fatal(err)
	}
	g, err := v.Verify(token)
	if err != nil {
		t.Fatalf("the runner would refuse the token: %v", err)
	}
	return g
}

func TestLoginAndToken(t *testing.T) {
	s, c := newTestBackend(t)
	if _, code := c.token(); code != http.StatusUnauthorized {
		t.Fatalf("GET /token before login: %d, want 401", code)
	}
	if code := c.do("GET", "/session", "", "", nil); code != http.StatusUnauthorized {
		t.Fatalf("GET /session before login: %d, want 401", code)
	}
	if code := c.login("u42"); code != http.StatusOK {
		t.Fatalf("login u42: %d", code)
	}
	var sess struct{ User, RunnerURL string }
	if code := c.do("GET", "/session", "", "", &sess); code != http.StatusOK || sess.User != "u42" || sess.RunnerURL != "http://127.0.0.1:8080" {
		t.Fatalf("GET /session: %d %+v", code, sess)
	}

	// The claims, as the runner reads them: u42's, course_sync only, read,
	// submit and cancel, for 15 minutes.
	realNow := time.Now().Truncate(time.Second)
	s.now = func() time.Time { return realNow }
	a, code := c.token()
	if code != http.StatusOK || a.Subject != "u42" {
		t.Fatalf("GET /token: %d %+v", code, a)
	}
	g := verify(t, a.Token)
	if g.Subject != "u42" {
		t.Errorf("subject %q, want u42", g.Subject)
	}
	if !slices.Equal(g.Scopes, []string{"course_sync"}) {
		t.Errorf("scopes %v, want [course_sync]", g.Scopes)
	}
	if !slices.Equal(g.Actions, []apptoken.Action{"read", "submit", "cancel"}) {
		t.Errorf("actions %v", g.Actions)
	}
	if ttl := g.Expires.Sub(realNow); ttl != 15*time.Minute {
		t.Errorf("the token lives %v, want 15m", ttl)
	}
	if exp, err := time.Parse(time.RFC3339, a.ExpiresAt); err != nil || !exp.Equal(g.Expires) {
		t.Errorf("expiresAt %q, the token's exp %v", a.ExpiresAt, g.Expires)
	}
	if g.AllowsScope("message_sync") {
		t.Error("the token opens another job")
	}
}

func TestSwitchingUserEndsTheOldSession(t *testing.T) {
	s, c := newTestBackend(t)
	if code := c.login("u42"); code != http.StatusOK {
		t.Fatalf("login u42: %d", code)
	}
	oldCookies := c.c.Jar.Cookies(mustURL(t, c.base))
	if code := c.login("u4"); code != http.StatusOK {
		t.Fatalf("login u4: %d", code)
	}
	a, _ := c.token()
	if g := verify(t, a.Token); g.Subject != "u4" {
		t.Fatalf("after switching to u4 the token is %q's", g.Subject)
	}
	s.mu.Lock()
	n := len(s.sessions)
	s.mu.Unlock()
	if n != 1 {
		t.Errorf("%d sessions after switching, want 1 (u42's ended)", n)
	}
	// u42's old cookie, replayed, is nobody's.
	stale := &testClient{t: t, base: c.base, c: &http.Client{}}
	req, _ := http.NewRequest("GET", c.base+"/token", nil)
	for _, ck := range oldCookies {
		req.AddCookie(ck)
	}
	resp, err := stale.c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("u42's old session cookie gets a token: %d", resp.StatusCode)
	}

	if code := c.do("POST", "/logout", "", "", nil); code != http.StatusNoContent {
		t.Fatalf("logout: %d", code)
	}
	if _, code := c.token(); code != http.StatusUnauthorized {
		t.Errorf("GET /token after logout: %d, want 401", code)
	}
}

func TestLoginRefuses(t *testing.T) {
	_, c := newTestBackend(t)
	for _, tc := range []struct {
		name, contentType, body string
		want                    int
	}{
		{"a form post (what another site's page could send)", "application/x-www-form-urlencoded", "user=u42", http.StatusUnsupportedMediaType},
		{"text/plain", "text/plain", `{"user":"u42"}`, http.StatusUnsupportedMediaType},
		{"no user", "application/json", `{}`, http.StatusBadRequest},
		{"a name that is no subject", "application/json", `{"user":"u42|x"}`, http.StatusBadRequest},
		{"not JSON", "application/json", `user`, http.StatusBadRequest},
	} {
		if code := c.do("POST", "/login", tc.contentType, tc.body, nil); code != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, code, tc.want)
		}
	}
	if _, code := c.token(); code != http.StatusUnauthorized {
		t.Errorf("GET /token after refused logins: %d, want 401", code)
	}
}

func TestNewServerChecksItsConfig(t *testing.T) {
	if _, err := newServer(config{Secret: "short", RunnerURL: runnerDefault}); err == nil {
		t.Error("a short secret accepted")
	}
	if _, err := newServer(config{Secret: testSecret, RunnerURL: "127.0.0.1:8080"}); err == nil {
		t.Error("a runner URL without scheme accepted")
	}
}

// The page's headers: only its own files and the runner may be reached.
func TestPageHeaders(t *testing.T) {
	_, c := newTestBackend(t)
	resp, err := c.c.Get(c.base + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	csp := resp.Header.Get("Content-Security-Policy")
	if !strings.Contains(csp, "connect-src 'self' http://127.0.0.1:8080;") || !strings.Contains(csp, "default-src 'none'") {
		t.Errorf("CSP %q", csp)
	}
	for _, p := range []string{"/static/app.js", "/static/style.css"} {
		resp, err := c.c.Get(c.base + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s: %d", p, resp.StatusCode)
		}
	}
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}
