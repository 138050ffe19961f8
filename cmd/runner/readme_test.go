//go:build unix

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tasklease/tasklease/internal/redistest"
)

// The README's tour and walkthrough, run as a newcomer would run them: the
// shell blocks marked <!-- readme-test: NAME --> are taken from README.md
// and docs/*.md verbatim, "go run ./cmd/X" runs a prebuilt X (a go on PATH
// that maps it), and the ports the README names are swapped for free ones.
// A README edit that breaks a command, a flag or an expected outcome fails
// here.

// readmeTestBlocks are the names of the marked blocks the tests below run.
// A block marked with a name not listed here runs nowhere, and
// TestDocsCommandBlocksAreRun (docs_test.go) fails on it, as it does on a
// name listed here that no block is marked with.
var readmeTestBlocks = []string{
	"tour/serve", "tour/client", "tour/json", // TestREADMETour
	"walkthrough/serve", "walkthrough/client", "walkthrough/trace", // TestREADMEWalkthrough
	"example-app/runner", "example-app/app", // examples/app: TestDocsExampleAppCommands (docs/example-app.md)
}

// readmeBlocks returns the marked shell blocks of README.md and docs/*.md
// by name; a name marked twice fails the test.
func readmeBlocks(t *testing.T) map[string]string {
	t.Helper()
	blocks, err := markedBlocks(repoFS(t))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for name, b := range blocks {
		out[name] = b.body
	}
	return out
}

// readmeEnv is a directory to run README blocks in: the repository's deploy/
// linked in (the walkthrough's config), and a bin/ first on PATH with the
// prebuilt commands and the go that runs them.
type readmeEnv struct {
	dir   string
	path  string // PATH for the blocks
	ports map[string]string
}

func newReadmeEnv(t *testing.T, ports ...string) *readmeEnv {
	t.Helper()
	for _, bin := range []string{"redis-server", "curl"} {
		if _, err := exec.LookPath(bin); err != nil {
			if redistest.RequireRedis() {
				t.Fatalf("%s is not on PATH: %v", bin, err)
			}
			t.Skipf("%s is not on PATH", bin)
		}
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, pkg := range []string{".", "../fencedemo"} {
		name := filepath.Base(pkg)
		if pkg == "." {
			name = "runner"
		}
		if out, err := exec.CommandContext(t.Context(), "go", "build", "-o", filepath.Join(bin, name), pkg).CombinedOutput(); err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	// README's "go run ./cmd/NAME ARGS" runs bin/NAME ARGS; nothing else is
	// expected of go there.
	goShim := `#!/bin/sh
if [ "$1" = run ] && [ -x "` + bin + `/$(basename "$2")" ]; then
  cmd=$(basename "$2"); shift 2; exec "` + bin + `/$cmd" "$@"
fi
echo "readme test: unexpected go $*" >&2; exit 2
`
	if err := os.WriteFile(filepath.Join(bin, "go"), []byte(goShim), 0o755); err != nil {
		t.Fatal(err)
	}
	repo, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(repo, "deploy"), filepath.Join(dir, "deploy")); err != nil {
		t.Fatal(err)
	}
	e := &readmeEnv{dir: dir, path: bin + string(os.PathListSeparator) + os.Getenv("PATH"), ports: map[string]string{}}
	for _, p := range ports {
		e.ports[p] = strconv.Itoa(redistest.FreePort(t))
	}
	return e
}

// port is the free port standing in for the README's port p.
func (e *readmeEnv) port(p string) string { return e.ports[p] }

// script is block with the README's ports swapped.
func (e *readmeEnv) script(t *testing.T, block string) string {
	t.Helper()
	if block == "" {
		t.Fatal("README block missing: is its <!-- readme-test: … --> marker still there?")
	}
	for from, to := range e.ports {
		block = regexp.MustCompile(`\b`+from+`\b`).ReplaceAllString(block, to)
	}
	return block
}

func (e *readmeEnv) command(ctx context.Context, script string, env ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "bash", "-e", "-o", "pipefail", "-c", script)
	cmd.Dir = e.dir
	cmd.Env = append(append(os.Environ(), "PATH="+e.path), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// Ctrl-C, as the README says: every process of the block gets SIGINT.
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGINT) }
	cmd.WaitDelay = 15 * time.Second
	return cmd
}

// background starts a long-running block (a "terminal 1") and stops its
// whole process group when the test ends, as Ctrl-C would.
func (e *readmeEnv) background(t *testing.T, block string, env ...string) *syncBuffer {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := e.command(ctx, e.script(t, block), env...)
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		if t.Failed() {
			t.Logf("terminal 1 said:\n%s", out.String())
		}
	})
	return out
}

// run runs a block (a "terminal 2") to its end and returns what it printed.
func (e *readmeEnv) run(t *testing.T, block string, env ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	cmd := e.command(ctx, e.script(t, block), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("terminal 2 failed: %v\n%s", err, out)
	}
	return string(out)
}

func wantLines(t *testing.T, out string, patterns ...string) {
	t.Helper()
	for _, p := range patterns {
		if !regexp.MustCompile(p).MatchString(out) {
			t.Errorf("output lacks %q:\n%s", p, out)
		}
	}
}

func TestREADMETour(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the exec stages' supervisor is Linux only")
	}
	blocks := readmeBlocks(t)
	e := newReadmeEnv(t, "8080")
	e.background(t, blocks["tour/serve"])
	out := e.run(t, blocks["tour/client"], "TASKLEASE_SERVER=http://127.0.0.1:"+e.port("8080"))
	wantLines(t, out,
		`(?m)^started: u42\|course_sync queued`,
		`(?m)^joined: u42\|course_sync running`,
		`(?m)done`,
		`(?m)requested .*manual`,
		`(?m)^not_running$`,
		`"outcome":"started"`,          // the foreground hook after the run ended
		`"key":"u42\|course_sync"`,     // the TaskView
		`(?m)^event: task|(?m)^data: `, // the SSE stream
	)
	// the security section's ways to send JSON, and a bodiless POST
	out = e.run(t, blocks["tour/json"])
	if n := strings.Count(out, `"results":[`); n != 2 {
		t.Errorf("want two foreground answers, got %d:\n%s", n, out)
	}
	wantLines(t, out, `"outcome":"(cancelling|cancelled|not_running)"`)
}

func TestREADMEWalkthrough(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the exec stages' supervisor is Linux only")
	}
	blocks := readmeBlocks(t)
	e := newReadmeEnv(t, "6390", "9000", "8081", "8082", "8083")
	e.background(t, blocks["walkthrough/serve"])
	out := e.run(t, blocks["walkthrough/client"])
	wantLines(t, out,
		`pod-a`, `pod-b`, `pod-c`,
		`(?m)^started: u42\|course_sync`,
		`"outcome":"joined"`,
		`(?m)^done: |(?m)\bdone\b`,
		`"u42\|course_sync":\{"token":\d+`,
		`(?m)409$`,
	)
	eventually(t, 20*time.Second, "the trace block to find the run span", func() error {
		if out, err := e.command(t.Context(), e.script(t, blocks["walkthrough/trace"])).CombinedOutput(); err != nil {
			return fmt.Errorf("%v: %s", err, out)
		} else if !strings.Contains(string(out), `"Name":"tasklease.run"`) {
			return fmt.Errorf("no run span in %s", out)
		}
		return nil
	})

	// The trace: one run span linking the submit spans of all three requests.
	var spans []stdoutSpan
	eventually(t, 20*time.Second, "the run span linking three submits", func() error {
		var err error
		if spans, err = readSpans(filepath.Join(e.dir, "spans-*.jsonl")); err != nil {
			return err
		}
		submits := map[string]string{} // span id → outcome, of the submits to run
		var run *stdoutSpan
		for i, s := range spans {
			if s.Name == "tasklease.run" {
				run = &spans[i]
			}
		}
		if run == nil {
			return fmt.Errorf("no tasklease.run span yet")
		}
		runID := run.attr("tasklease.run_id")
		for _, s := range spans {
			if s.Name == "tasklease.submit" && s.attr("tasklease.run_id") == runID {
				submits[s.SpanContext.SpanID] = s.attr("tasklease.outcome")
			}
		}
		if len(submits) != 3 {
			return fmt.Errorf("%d submit spans of run %s, want 3 (started, joined, joined): %v", len(submits), runID, submits)
		}
		linked := map[string]bool{}
		for _, l := range run.Links {
			linked[l.SpanContext.SpanID] = true
		}
		for id, outcome := range submits {
			if !linked[id] {
				return fmt.Errorf("the run span does not link the %s submit %s (links %v)", outcome, id, run.Links)
			}
		}
		return nil
	})
}

// stdoutSpan is what the console exporter (stdouttrace) writes per span,
// as much as the test reads.
type stdoutSpan struct {
	Name        string
	SpanContext struct{ SpanID string }
	Links       []struct{ SpanContext struct{ SpanID string } }
	Attributes  []struct {
		Key   string
		Value struct{ Value any }
	}
}

func (s stdoutSpan) attr(key string) string {
	for _, a := range s.Attributes {
		if a.Key == key {
			return fmt.Sprint(a.Value.Value)
		}
	}
	return ""
}

func readSpans(glob string) ([]stdoutSpan, error) {
	files, err := filepath.Glob(glob)
	if err != nil || len(files) == 0 {
		return nil, fmt.Errorf("no span files %s (%v)", glob, err)
	}
	var out []stdoutSpan
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(strings.NewReader(string(b)))
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			var s stdoutSpan
			if json.Unmarshal(sc.Bytes(), &s) == nil && s.Name != "" {
				out = append(out, s)
			}
		}
	}
	return out, nil
}

// The upgrade clean-ups (redis-cli pipelines in CHANGELOG.md's upgrade
// notes; README.md's Operations had them, docs/*.md may) delete the keys
// older versions left and nothing else.
func TestREADMEUpgradeCleanup(t *testing.T) {
	fsys := repoFS(t)
	files, err := commandDocs(fsys)
	if err != nil {
		t.Fatal(err)
	}
	var cmds [][]string // each [match, command], once per command
	for _, f := range append(files, "CHANGELOG.md") {
		b, err := fs.ReadFile(fsys, f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range regexp.MustCompile("`(redis-cli --scan [^`]*)`").FindAllStringSubmatch(string(b), -1) {
			if !slices.ContainsFunc(cmds, func(c []string) bool { return c[1] == m[1] }) {
				cmds = append(cmds, m)
			}
		}
	}
	if len(cmds) != 2 {
		t.Fatalf("want the two redis-cli clean-ups of the upgrade notes, found %d: %q", len(cmds), cmds)
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		if redistest.RequireRedis() {
			t.Fatal(err)
		}
		t.Skip("redis-cli is not on PATH")
	}
	srv := redistest.StartServer(t)
	rdb := srv.Client(t)
	ctx := t.Context()
	left := []string{"{tasklease:p1}:task:u1|s", "{tasklease:p1}:history:u1|s", "{tasklease:p1}:subjects-seen:s", "{tasklease:p1}:links:u1|s|next"}
	gone := []string{"{tasklease:p1}:hist:u1|s", "{tasklease:p2}:hist:u2|s", "{tasklease:p1}:subjects:s"}
	for _, k := range append(slices.Clone(left), gone...) {
		if err := rdb.Set(ctx, k, "x", 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// redis-cli on PATH talks to the test's server
	bin := t.TempDir()
	shim := "#!/bin/sh\nexec " + cli + " -h 127.0.0.1 -p " + strings.TrimPrefix(srv.Addr(), "127.0.0.1:") + " \"$@\"\n"
	if err := os.WriteFile(filepath.Join(bin, "redis-cli"), []byte(shim), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, c := range cmds {
		cmd := exec.CommandContext(ctx, "bash", "-e", "-o", "pipefail", "-c", c[1])
		cmd.Env = append(os.Environ(), "PATH="+bin+string(os.PathListSeparator)+os.Getenv("PATH"))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", c[1], err, out)
		}
	}
	for _, k := range left {
		if n, _ := rdb.Exists(ctx, k).Result(); n != 1 {
			t.Errorf("%s was deleted", k)
		}
	}
	for _, k := range gone {
		if n, _ := rdb.Exists(ctx, k).Result(); n != 0 {
			t.Errorf("%s is still there", k)
		}
	}
}
