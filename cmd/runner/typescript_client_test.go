package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// requireNodeEnv makes a missing node, npm or clients/typescript/node_modules
// a failure instead of a skip (for .ci/run).
const requireNodeEnv = "TASKLEASE_REQUIRE_NODE"

// tsClientSecret is the runner's hmacSecret; the Node tests mint their
// subject tokens with it.
const tsClientSecret = "ts-client-test-secret-0123456789abcdef"

// tsClientConfig: course_sync has two short exec stages; a subject that
// starts with "fail" fails its first stage, one that starts with "slow"
// runs until cancelled; no retries, so a failure shows at once.
// message_sync is a second, quick job for scope-limited tokens.
const tsClientConfig = `
runner:
  id: ts-client-test
  leaseTTL: 3s
  shutdownGrace: 1s
log:
  level: warn
http:
  subjectTokens:
    hmacSecret: ` + tsClientSecret + `
  allowedOrigins: ["http://localhost:3000"]
jobs:
  course_sync:
    foreground: true
    retry: {maxAttempts: 1}
    stages:
      - name: pulling
        exec: ["sh", "-c", "case \"$TASKLEASE_SUBJECT\" in fail*) exit 1;; slow*) sleep 30;; esac; sleep 0.4"]
        killGrace: 1s
      - name: pushing
        exec: ["sh", "-c", "sleep 0.4"]
  message_sync:
    foreground: true
    retry: {maxAttempts: 1}
    stages:
      - name: pulling
        exec: ["true"]
`

// TestTypeScriptClient builds clients/typescript, checks its generated
// types against internal/httpapi/openapi.json, and runs its tests (the
// client, watch and the React hook) against a real runner serve.
func TestTypeScriptClient(t *testing.T) {
	require := os.Getenv(requireNodeEnv) == "1"
	missing := func(format string, args ...any) {
		t.Helper()
		if require {
			t.Fatalf(format+" (and %s=1)", append(args, requireNodeEnv)...)
		}
		t.Skipf(format, args...)
	}
	for _, tool := range []string{"node", "npm"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing("no %s on PATH", tool)
		}
	}
	dir, err := filepath.Abs(filepath.Join("..", "..", "clients", "typescript"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules")); err != nil {
		missing("%s/node_modules is missing: run npm ci --prefix clients/typescript", dir)
	}

	srv := startServe(t, tsClientConfig)
	env := append(os.Environ(), "TASKLEASE_URL="+srv.url, "TASKLEASE_APP_SECRET="+tsClientSecret)
	for _, script := range []string{"build", "check:types", "test"} {
		if !runNpm(t, dir, env, script) {
			t.Errorf("npm run %s failed; runner log:\n%s", script, srv.log)
			return
		}
	}
}

// runNpm runs one npm script in dir, its output streamed into t.Log line
// by line, and reports whether it exited 0.
func runNpm(t *testing.T, dir string, env []string, script string) bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "npm", "run", "--silent", script)
	cmd.Dir = dir
	cmd.Env = env
	cmd.WaitDelay = 5 * time.Second
	w := &lineLogger{t: t, prefix: script + ": "}
	cmd.Stdout = w
	cmd.Stderr = w
	start := time.Now()
	err := cmd.Run()
	w.flush()
	t.Logf("npm run %s: %v in %v", script, errOr(err, "ok"), time.Since(start).Round(time.Millisecond))
	return err == nil
}

func errOr(err error, ok string) string {
	if err != nil {
		return err.Error()
	}
	return ok
}

// lineLogger writes whole lines to t.Log as they come, so a long npm test
// shows its progress in go test -v and everything on failure.
type lineLogger struct {
	t      *testing.T
	prefix string
	mu     sync.Mutex
	part   string
}

func (l *lineLogger) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := l.part + string(p)
	for {
		i := strings.IndexByte(s, '\n')
		if i < 0 {
			break
		}
		l.t.Log(l.prefix + s[:i])
		s = s[i+1:]
	}
	l.part = s
	return len(p), nil
}

func (l *lineLogger) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.part != "" {
		l.t.Log(l.prefix + l.part)
		l.part = ""
	}
}
