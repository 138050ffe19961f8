package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/cookiejar"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// docsPage is the walkthrough whose commands TestDocsExampleAppCommands
// runs. cmd/runner's TestDocsCommandBlocksAreRun knows the blocks' names
// (readmeTestBlocks) and fails on a shell block of it that nothing runs.
const docsPage = "../../docs/example-app.md"

// docsBlock returns the ```sh block marked <!-- readme-test: name --> in
// the page.
func docsBlock(t *testing.T, page, name string) string {
	t.Helper()
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile("(?s)<!-- readme-test: " + regexp.QuoteMeta(name) + " -->\n\\s*```sh\n(.*?)\n```")
	m := re.FindSubmatch(b)
	if m == nil {
		t.Fatalf("%s: no ```sh block marked <!-- readme-test: %s -->", page, name)
	}
	return string(m[1])
}

// The defaults the docs rely on agree: the app listens where runner.yaml
// allows the page's origin, and looks for the runner where it listens.
func TestDefaultsMatchRunnerConfig(t *testing.T) {
	b, err := os.ReadFile("runner.yaml")
	if err != nil {
		t.Fatal(err)
	}
	y := string(b)
	if want := "listen: " + strings.TrimPrefix(runnerDefault, "http://"); !strings.Contains(y, want) {
		t.Errorf("runner.yaml lacks %q (the app's default runner URL is %s)", want, runnerDefault)
	}
	if want := "${TASKLEASE_EXAMPLE_ORIGIN:-http://" + listenDefault + "}"; !strings.Contains(y, want) {
		t.Errorf("runner.yaml's allowedOrigins lack %q (the app listens on %s)", want, listenDefault)
	}
}

// The two commands of docs/example-app.md's "Run it", as written, each in
// its own shell as in its own terminal ("go run ./cmd/runner" and "go run
// ./examples/app" run prebuilt binaries; the ports are free ones instead of
// 8080 and 3000), then what the page does through them: sign in, get a
// token, sync from the page's origin.
func TestDocsExampleAppCommands(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the exec stages' supervisor is Linux only")
	}
	runnerBlock := docsBlock(t, docsPage, "example-app/runner")
	appBlock := docsBlock(t, docsPage, "example-app/app")

	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	for pkg, name := range map[string]string{"../../cmd/runner": "runner", ".": "app"} {
		if out, err := exec.CommandContext(t.Context(), "go", "build", "-o", filepath.Join(bin, name), pkg).CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	goShim := "#!/bin/sh\n" +
		`if [ "$1" = run ] && [ "$2" = ./cmd/runner ]; then shift 2; exec "` + bin + `/runner" "$@"; fi` + "\n" +
		`if [ "$1" = run ] && [ "$2" = ./examples/app ]; then shift 2; exec "` + bin + `/app" "$@"; fi` + "\n" +
		`echo "docs test: unexpected go $*" >&2; exit 2` + "\n"
	if err := os.WriteFile(filepath.Join(bin, "go"), []byte(goShim), 0o755); err != nil {
		t.Fatal(err)
	}

	// The repository as the commands see it: examples/app/runner.yaml with
	// free ports for 8080 and 3000.
	runnerPort, appPort := strconv.Itoa(freePort(t)), strconv.Itoa(freePort(t))
	cfg, err := os.ReadFile("runner.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfgText := strings.ReplaceAll(strings.ReplaceAll(string(cfg), ":8080", ":"+runnerPort), ":3000", ":"+appPort)
	if err := os.MkdirAll(filepath.Join(dir, "examples", "app"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "examples", "app", "runner.yaml"), []byte(cfgText), 0o644); err != nil {
		t.Fatal(err)
	}

	env := []string{
		"PATH=" + bin + string(os.PathListSeparator) + os.Getenv("PATH"),
		"TASKLEASE_TOKEN=", "TASKLEASE_EXAMPLE_ORIGIN=", "TASKLEASE_REDIS_URL=", "TASKLEASE_LOG_LEVEL=warn",
	}
	runnerOut := startBlock(t, dir, runnerBlock, env...)
	runner := "http://127.0.0.1:" + runnerPort
	waitFor(t, 20*time.Second, "the runner ready", func() error {
		resp, err := http.Get(runner + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("readyz %d", resp.StatusCode)
		}
		return nil
	}, runnerOut)
	appOut := startBlock(t, dir, appBlock, append(env,
		"TASKLEASE_EXAMPLE_LISTEN=127.0.0.1:"+appPort, "TASKLEASE_URL="+runner)...)
	app := "http://127.0.0.1:" + appPort
	waitFor(t, 20*time.Second, "the app's URL printed", func() error {
		if !strings.Contains(appOut.String(), "examples/app: open "+app+"/ in a browser") {
			return fmt.Errorf("not yet")
		}
		return nil
	}, appOut)

	// Sign in as u42 and get the token, as the page does.
	jar, _ := cookiejar.New(nil)
	browser := &http.Client{Jar: jar}
	resp, err := browser.Post(app+"/login", "application/json", strings.NewReader(`{"user":"u42"}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("login: %d", resp.StatusCode)
	}
	resp, err = browser.Get(app + "/token")
	if err != nil {
		t.Fatal(err)
	}
	var tok struct{ Token string }
	err = json.NewDecoder(resp.Body).Decode(&tok)
	resp.Body.Close()
	if err != nil || tok.Token == "" {
		t.Fatalf("GET /token: %v", err)
	}

	// The page's sync, from its origin: the preflight, then the submit.
	req, _ := http.NewRequest("OPTIONS", runner+"/v1/tasks/u42/course_sync/runs", nil)
	req.Header.Set("Origin", app)
	req.Header.Set("Access-Control-Request-Method", "POST")
	req.Header.Set("Access-Control-Request-Headers", "authorization,content-type")
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent || resp.Header.Get("Access-Control-Allow-Origin") != app {
		t.Fatalf("preflight from the page's origin: %d, Access-Control-Allow-Origin %q", resp.StatusCode, resp.Header.Get("Access-Control-Allow-Origin"))
	}
	req, _ = http.NewRequest("POST", runner+"/v1/tasks/u42/course_sync/runs", strings.NewReader(`{"source":"manual"}`))
	req.Header.Set("Origin", app)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+tok.Token)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var sub struct{ Outcome string }
	_ = json.NewDecoder(resp.Body).Decode(&sub)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || sub.Outcome != "started" {
		t.Fatalf("sync now from the page's origin: %d %+v\nrunner:\n%s", resp.StatusCode, sub, runnerOut)
	}
}

// startBlock runs a shell block in dir in the background, as in a terminal
// of its own, and interrupts its process group when the test ends.
func startBlock(t *testing.T, dir, block string, env ...string) *syncBuffer {
	t.Helper()
	cmd := exec.Command("bash", "-e", "-c", block)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGINT) // Ctrl-C
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
	})
	return out
}

// waitFor polls cond until it returns nil, failing after d with out.
func waitFor(t *testing.T, d time.Duration, what string, cond func() error, out *syncBuffer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	for {
		err := cond()
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: %v\noutput:\n%s", what, err, out)
		case <-time.After(20 * time.Millisecond):
		}
	}
}
