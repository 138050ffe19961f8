//go:build linux

package supervisor

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// hostArg re-executes this test binary as the supervisor (see TestMain).
const hostArg = "__supervisor-test-host"

func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == hostArg {
		// syscall.Exit: under -race os.Exit(0) runs the race runtime's
		// finaliser, which sleeps a second (GORACE atexit_sleep_ms) — in
		// every successful supervised command.
		syscall.Exit(Main(os.Args[2:]))
	}
	if len(os.Args) > 1 && os.Args[1] == lowerHostArg {
		os.Exit(lowerPriorityHost())
	}
	os.Exit(m.Run())
}

const markEnv = "SUPERVISOR_TEST_MARK"

// marked lists the live processes whose environment has markEnv=mark.
func marked(mark string) []int {
	want := []byte(markEnv + "=" + mark)
	names, _ := filepath.Glob("/proc/[0-9]*/environ")
	var out []int
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			continue
		}
		for _, kv := range bytes.Split(b, []byte{0}) {
			if bytes.Equal(kv, want) {
				var pid int
				fmt.Sscanf(n, "/proc/%d/environ", &pid)
				if p, ok := readStat("/proc", pid); ok && !p.dead() {
					out = append(out, pid)
				}
				break
			}
		}
	}
	return out
}

// supProc is a supervisor started by a test.
type supProc struct {
	cmd    *exec.Cmd
	status *os.File
	mark   string
	exited chan struct{}
	err    error
	stderr bytes.Buffer
}

// startSupervisor runs Main in a child process with a status pipe; the
// command gets a unique marker in its environment.
func startSupervisor(t *testing.T, o Options) *supProc {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	o.StatusFD = 3
	s := &supProc{status: r, mark: fmt.Sprintf("%s-%d-%d", t.Name(), os.Getpid(), time.Now().UnixNano()), exited: make(chan struct{})}
	s.cmd = exec.Command(exe, append([]string{hostArg}, o.Args()...)...)
	s.cmd.Dir = t.TempDir()
	s.cmd.Env = append(os.Environ(), markEnv+"="+s.mark)
	s.cmd.ExtraFiles = []*os.File{w}
	s.cmd.Stderr = &s.stderr
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: DeathSignal}
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	go func() { s.err = s.cmd.Wait(); close(s.exited) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.exited
		r.Close()
		for _, pid := range marked(s.mark) {
			t.Errorf("marked process %d left behind", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	return s
}

// wait waits for the supervisor's exit and returns its exit code and
// status.
func (s *supProc) wait(t *testing.T, d time.Duration) (int, Status) {
	t.Helper()
	select {
	case <-s.exited:
	case <-time.After(d):
		t.Fatalf("supervisor did not exit within %v; stderr:\n%s", d, s.stderr.String())
	}
	st, err := ReadStatus(s.status, nil)
	if err != nil {
		t.Fatalf("status: %v", err)
	}
	code := 0
	var ee *exec.ExitError
	if errors.As(s.err, &ee) {
		code = ee.ExitCode()
	} else if s.err != nil {
		t.Fatal(s.err)
	}
	return code, st
}

func TestMainReportsExitAndSignal(t *testing.T) {
	for _, c := range []struct {
		script string
		code   int
		want   Status
	}{
		{"exit 0", 0, Status{Ended: true}},
		{"exit 5", 5, Status{Ended: true, Code: 5}},
		{"exit 137", 137, Status{Ended: true, Code: 137}},
		{"kill -9 $$", 128 + 9, Status{Ended: true, Signal: syscall.SIGKILL}},
	} {
		s := startSupervisor(t, Options{Grace: time.Second, ParentPID: os.Getpid(), Argv: []string{"sh", "-c", c.script}})
		code, st := s.wait(t, 10*time.Second)
		if !st.Started || st.PID <= 0 {
			t.Errorf("%q: status %+v: no started line", c.script, st)
		}
		st.Started, st.PID = false, 0
		if code != c.code || st != c.want {
			t.Errorf("%q: exit %d, status %+v; want %d, %+v (stderr %q)", c.script, code, st, c.code, c.want, s.stderr.String())
		}
	}
}

func TestMainStartError(t *testing.T) {
	s := startSupervisor(t, Options{Path: "/nonexistent/tasklease-x", Argv: []string{"x"}})
	code, st := s.wait(t, 10*time.Second)
	if code != 127 || st.StartErr != syscall.ENOENT || st.Started || st.Ended {
		t.Errorf("exit %d, status %+v; want 127 and start-error ENOENT", code, st)
	}
	s = startSupervisor(t, Options{Path: "/dev/null", Argv: []string{"null"}})
	if code, st := s.wait(t, 10*time.Second); code != 126 || st.StartErr != syscall.EACCES {
		t.Errorf("exit %d, status %+v; want 126 and start-error EACCES", code, st)
	}
}

// A supervisor whose parent is not the one it was told about starts
// nothing: the runner died before the parent-death signal could be caught.
func TestMainParentGone(t *testing.T) {
	flag := filepath.Join(t.TempDir(), "ran")
	s := startSupervisor(t, Options{ParentPID: 1, Argv: []string{"touch", flag}})
	code, st := s.wait(t, 10*time.Second)
	if code != 1 || st.Started {
		t.Errorf("exit %d, status %+v; want 1 and nothing started", code, st)
	}
	if _, err := os.Stat(flag); err == nil {
		t.Error("the command ran")
	}
}

// The command exits; a setsid'd daemon it left (ignoring SIGTERM) is
// killed after the short leftover grace, and the supervisor reports only
// once it is gone.
func TestMainKillsLeftoversOnExit(t *testing.T) {
	dir := t.TempDir()
	script := `( setsid sh -c 'trap "" TERM; echo $$ > daemon.pid; exec sleep 300' & ); while [ ! -s daemon.pid ]; do sleep 0.01; done; exit 4`
	s := startSupervisor(t, Options{Grace: 30 * time.Second, Argv: []string{"sh", "-c", "cd " + dir + " && " + script}})
	start := time.Now()
	code, st := s.wait(t, 10*time.Second)
	if code != 4 || !st.Ended || st.Code != 4 {
		t.Errorf("exit %d, status %+v; want 4", code, st)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %v", d)
	}
	if left := marked(s.mark); len(left) > 0 {
		t.Errorf("processes %v alive after the supervisor reported", left)
	}
}

// SIGTERM: every descendant gets it (a setsid'd one too, which exits on
// it), and what ignores it is SIGKILLed after the grace.
func TestMainTermThenKill(t *testing.T) {
	dir := t.TempDir()
	script := `( setsid sh -c 'trap "echo > termed; exit 0" TERM; echo $$ > polite.pid; while :; do sleep 0.05; done' & );
		( setsid sh -c 'trap "" TERM; echo $$ > stubborn.pid; exec sleep 300' & );
		trap '' TERM; while [ ! -s polite.pid ] || [ ! -s stubborn.pid ]; do sleep 0.01; done; echo > ready; sleep 300`
	const grace = 500 * time.Millisecond
	s := startSupervisor(t, Options{Grace: grace, Argv: []string{"sh", "-c", "cd " + dir + " && " + script}})
	waitFile(t, filepath.Join(dir, "ready"))
	start := time.Now()
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	code, st := s.wait(t, 10*time.Second)
	d := time.Since(start)
	if d < grace*9/10 || d > grace+3*time.Second {
		t.Errorf("stopped after %v, want about the %v grace", d, grace)
	}
	if code != 137 || st.Signal != syscall.SIGKILL {
		t.Errorf("exit %d, status %+v; want the command killed by SIGKILL", code, st)
	}
	if _, err := os.Stat(filepath.Join(dir, "termed")); err != nil {
		t.Error("the setsid'd descendant did not get SIGTERM")
	}
	if left := marked(s.mark); len(left) > 0 {
		t.Errorf("processes %v alive after the supervisor reported", left)
	}
}

// DeathSignal: no grace at all, even with a long one configured.
func TestMainDeathSignalKillsAtOnce(t *testing.T) {
	dir := t.TempDir()
	script := `( setsid sh -c 'trap "" TERM; echo $$ > daemon.pid; exec sleep 300' & ); trap '' TERM;
		while [ ! -s daemon.pid ]; do sleep 0.01; done; echo > ready; sleep 300`
	s := startSupervisor(t, Options{Grace: time.Minute, Argv: []string{"sh", "-c", "cd " + dir + " && " + script}})
	waitFile(t, filepath.Join(dir, "ready"))
	start := time.Now()
	if err := s.cmd.Process.Signal(DeathSignal); err != nil {
		t.Fatal(err)
	}
	code, _ := s.wait(t, 10*time.Second)
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("took %v after the death signal; want an immediate SIGKILL", d)
	}
	if code != 137 {
		t.Errorf("exit %d, want 137", code)
	}
	if left := marked(s.mark); len(left) > 0 {
		t.Errorf("processes %v alive after the supervisor exited", left)
	}
}

func waitFile(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not created in time", path)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestMainUsage(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(exe, hostArg, "sleep", "1").CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.Contains(string(out), "usage:") {
		t.Errorf("bad usage: %v, %q", err, out)
	}
}

// niceOf reads a thread's niceness (field 19 of its stat).
func niceOf(t *testing.T, statPath string) (int, bool) {
	t.Helper()
	b, err := os.ReadFile(statPath)
	if err != nil {
		return 0, false // the thread exited
	}
	_, after, _ := bytes.Cut(b, []byte(") "))
	f := strings.Fields(string(after))
	var n int
	if _, err := fmt.Sscan(f[16], &n); err != nil {
		t.Fatalf("%s: nice %q: %v", statPath, f[16], err)
	}
	return n, true
}

// lowerHostArg runs lowerPriorityHost instead of the supervisor.
const lowerHostArg = "__supervisor-test-lower-priority"

// lowerPriorityHost starts a child, calls lowerPriority as a supervisor
// would, and prints the niceness of each of its threads, then the child's.
func lowerPriorityHost() int {
	child := exec.Command("sleep", "30")
	if err := child.Start(); err != nil {
		fmt.Println(err)
		return 1
	}
	defer child.Process.Kill()
	s := &supervisor{procRoot: "/proc", self: os.Getpid()}
	s.lowerPriority()
	tasks, _ := filepath.Glob("/proc/self/task/*/stat")
	tasks = append(tasks, fmt.Sprintf("/proc/%d/stat", child.Process.Pid))
	for _, task := range tasks {
		b, err := os.ReadFile(task)
		if err != nil {
			continue
		}
		_, after, _ := bytes.Cut(b, []byte(") "))
		fmt.Println(strings.Fields(string(after))[16])
	}
	return 0
}

// TestLowerPriority: a supervisor that has sent its SIGKILLs sets each of
// its threads to niceness 19, so hundreds of supervisors cleaning up after
// a dead pod do not starve the surviving runners' lease renewals; the
// command keeps its niceness, so it dies at once.
func TestLowerPriority(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(exe, lowerHostArg).Output()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	own, _ := niceOf(t, "/proc/self/stat")
	lines := strings.Fields(string(out))
	if len(lines) < 3 { // the Go runtime has several threads, plus the child
		t.Fatalf("output %q", out)
	}
	threads, child := lines[:len(lines)-1], lines[len(lines)-1]
	for i, n := range threads {
		if n != fmt.Sprint(supervisorNice) {
			t.Errorf("thread %d of %d at niceness %s; want %d", i+1, len(threads), n, supervisorNice)
		}
	}
	if child != fmt.Sprint(own) {
		t.Errorf("the command at niceness %s; want its runner's %d", child, own)
	}
}
