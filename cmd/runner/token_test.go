package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tasklease/tasklease/internal/apptoken"
)

// TestTokenCommand: runner token mints a token the configured verifier
// accepts, with the claims asked for, from the config or the environment.
func TestTokenCommand(t *testing.T) {
	secret := strings.Repeat("k", 40)
	mint := func(args ...string) (string, string, int) {
		var out, errb bytes.Buffer
		code := run(t.Context(), append([]string{"token"}, args...), &out, &errb)
		return strings.TrimSpace(out.String()), errb.String(), code
	}
	t.Setenv(appSecretEnv, secret)
	tok, stderr, code := mint("--subject", "u42", "--ttl", "15m", "--scopes", "course_sync", "--actions", "read,submit")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	v, err := apptoken.NewVerifier(t.Context(), apptoken.Config{HMACSecret: secret})
	if err != nil {
		t.Fatal(err)
	}
	g, err := v.Verify(tok)
	if err != nil {
		t.Fatal(err)
	}
	if g.Subject != "u42" || !g.AllowsScope("course_sync") || g.AllowsScope("backup") || g.Allows(apptoken.ActionCancel) ||
		!g.Allows(apptoken.ActionSubmit) || time.Until(g.Expires) > 15*time.Minute || time.Until(g.Expires) < 14*time.Minute {
		t.Fatalf("grant %+v", g)
	}

	// From a config: its secret, issuer and audience.
	cfg := filepath.Join(t.TempDir(), "c.yaml")
	other := strings.Repeat("c", 32)
	if err := os.WriteFile(cfg, []byte("http:\n  subjectTokens: {hmacSecret: "+other+", issuer: https://app.test/, audience: tasklease}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tok, stderr, code = mint("--config", cfg, "--subject", "u4")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	v, err = apptoken.NewVerifier(t.Context(), apptoken.Config{HMACSecret: other, Issuer: "https://app.test/", Audience: "tasklease"})
	if err != nil {
		t.Fatal(err)
	}
	if g, err := v.Verify(tok); err != nil || g.Subject != "u4" || g.Scopes != nil || g.Actions != nil {
		t.Fatalf("grant %+v, %v", g, err)
	}

	for _, tc := range []struct {
		args []string
		msg  string
	}{
		{nil, "needs --subject"},
		{[]string{"--subject", "u4|x"}, "not allowed"},
		{[]string{"--subject", "u4", "--actions", "admin"}, `unknown action "admin"`},
		{[]string{"--subject", "u4", "--ttl", "-1m"}, "TTL must be positive"},
	} {
		if _, stderr, code := mint(tc.args...); code != exitUsage || !strings.Contains(stderr, tc.msg) {
			t.Errorf("%v: exit %d, %q; want %d and %q", tc.args, code, stderr, exitUsage, tc.msg)
		}
	}
	t.Setenv(appSecretEnv, "")
	if _, stderr, code := mint("--subject", "u4"); code != exitUsage || !strings.Contains(stderr, "no secret") || strings.Contains(stderr, secret) {
		t.Errorf("without a secret: exit %d, %q", code, stderr)
	}
}
