//go:build linux

package supervisor

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// statLine is a /proc/<pid>/stat line with the given fields (the rest
// zero).
func statLine(pid int, comm string, state byte, ppid int, start uint64) string {
	return fmt.Sprintf("%d (%s) %c %d 0 0 0 -1 4194304 0 0 0 0 0 0 0 0 20 0 1 0 %d 0 0\n", pid, comm, state, ppid, start)
}

func TestParseStat(t *testing.T) {
	// A command name may hold spaces and parentheses.
	p, err := parseStat([]byte(statLine(4242, "we (ird) ) name", 'S', 17, 140393)))
	if err != nil {
		t.Fatal(err)
	}
	if p != (proc{pid: 4242, ppid: 17, state: 'S', start: 140393}) {
		t.Errorf("parsed %+v", p)
	}
	// A real one: this process.
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		t.Fatal(err)
	}
	self, err := parseStat(b)
	if err != nil || self.pid != os.Getpid() || self.ppid != os.Getppid() || self.start == 0 {
		t.Errorf("/proc/self/stat: %+v, %v", self, err)
	}
	for _, bad := range []string{"", "12", "12 (x", "x (sh) S 1", "12 (sh) S one 0 0 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5", "12 (sh) S 1 0 0"} {
		if _, err := parseStat([]byte(bad)); err == nil {
			t.Errorf("parseStat(%q) accepted", bad)
		}
	}
}

// fakeProc writes a /proc-like tree: pid → stat line.
func fakeProc(t *testing.T, procs map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for name, stat := range procs {
		dir := filepath.Join(root, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if stat != "" {
			if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(stat), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	return root
}

func pids(ps []proc) []int {
	var out []int
	for _, p := range ps {
		out = append(out, p.pid)
	}
	slices.Sort(out)
	return out
}

// The walk follows parent links all the way down, not just to children,
// leaves zombies out but walks through them, and survives malformed,
// vanished and unrelated entries.
func TestDescendantsWalk(t *testing.T) {
	root := fakeProc(t, map[string]string{
		"100":  statLine(100, "supervisor", 'S', 1, 1),
		"101":  statLine(101, "sh", 'S', 100, 2),
		"102":  statLine(102, "zombie child", 'Z', 100, 3),
		"103":  statLine(103, "sh -c", 'S', 101, 4),
		"104":  statLine(104, "grandgrandchild", 'R', 103, 5),
		"105":  statLine(105, "unrelated", 'S', 1, 6),
		"106":  statLine(106, "child of unrelated", 'S', 105, 7),
		"107":  statLine(107, "self parent", 'S', 107, 8),
		"108":  statLine(108, "reparented daemon", 'S', 100, 9),
		"109":  statLine(109, "daemon worker", 'D', 108, 10),
		"110":  statLine(110, "stopped", 'T', 109, 11),
		"111":  statLine(111, "zombie grandchild", 'Z', 103, 12),
		"112":  "", // exited while listed: no stat
		"113":  "garbage",
		"114":  statLine(999, "pid mismatch", 'S', 100, 13),
		"self": statLine(100, "supervisor", 'S', 1, 1),
		"net":  "",
		"0":    statLine(0, "zero", 'S', 100, 14),
	})
	got, err := descendants(root, 100)
	if err != nil {
		t.Fatal(err)
	}
	if want := []int{101, 103, 104, 108, 109, 110}; !slices.Equal(pids(got), want) {
		t.Errorf("descendants of 100 = %v, want %v", pids(got), want)
	}
	got, _ = descendants(root, 103)
	if want := []int{104}; !slices.Equal(pids(got), want) {
		t.Errorf("descendants of 103 = %v, want %v", pids(got), want)
	}
	got, _ = descendants(root, 104)
	if len(got) != 0 {
		t.Errorf("descendants of a leaf = %v", pids(got))
	}
	if _, err := descendants(filepath.Join(root, "missing"), 100); err == nil {
		t.Error("an unreadable /proc must be an error, not an empty list")
	}
}

// A cycle in the parent links (impossible in a consistent listing, but a
// listing is not a snapshot) must not hang the walk.
func TestDescendantsCycle(t *testing.T) {
	ps := []proc{{pid: 2, ppid: 1, state: 'S'}, {pid: 3, ppid: 2, state: 'S'}, {pid: 2, ppid: 3, state: 'S'}}
	if got := descendantsOf(ps, 1); !slices.Equal(pids(got), []int{2, 3}) {
		t.Errorf("got %v", pids(got))
	}
}

// On the real /proc: a shell's children and grandchildren are found under
// this process, with their parent links, by a full scan and along the
// kernel's children lists alike.
func TestDescendantsLive(t *testing.T) {
	t.Run("scan", func(t *testing.T) { testDescendantsLive(t, descendants) })
	t.Run("tree", func(t *testing.T) {
		if !hasChildrenLists("/proc", os.Getpid()) {
			t.Skip("this kernel keeps no children lists")
		}
		testDescendantsLive(t, treeDescendants)
	})
}

func testDescendantsLive(t *testing.T, descendants func(string, int) ([]proc, error)) {
	dir := t.TempDir()
	cmd := exec.Command("sh", "-c", `sh -c 'sleep 30 & echo $! > grandchild.pid; wait' & sleep 30 & echo $! > child.pid; wait`)
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	})
	child, grandchild := waitPIDFile(t, filepath.Join(dir, "child.pid")), waitPIDFile(t, filepath.Join(dir, "grandchild.pid"))

	deadline := time.Now().Add(5 * time.Second)
	for {
		ps, err := descendants("/proc", os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		byPID := map[int]proc{}
		for _, p := range ps {
			byPID[p.pid] = p
		}
		sh, gc := byPID[cmd.Process.Pid], byPID[grandchild]
		_, hasChild := byPID[child]
		if sh.ppid == os.Getpid() && hasChild && gc.pid != 0 {
			mid, ok := byPID[gc.ppid]
			if !ok || mid.ppid != cmd.Process.Pid {
				t.Fatalf("grandchild %d's parent %d is not a child of the shell %d: %v", grandchild, gc.ppid, cmd.Process.Pid, ps)
			}
			if len(ps) != 4 { // sh, sleep, sh, sleep
				t.Errorf("descendants %v, want 4", ps)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("descendants %v lack the shell %d, child %d or grandchild %d", ps, cmd.Process.Pid, child, grandchild)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// signalProc refuses a pid whose start time says it is another process now.
func TestSignalProcChecksIdentity(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-exited })
	p, ok := readStat("/proc", cmd.Process.Pid)
	if !ok {
		t.Fatal("no stat for the child")
	}
	stale := p
	stale.start++
	signalProc("/proc", stale, syscall.SIGKILL)
	select {
	case <-exited:
		t.Fatal("signalled a process whose start time did not match")
	case <-time.After(100 * time.Millisecond):
	}
	signalProc("/proc", p, syscall.SIGKILL)
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Fatal("the matching process was not signalled")
	}
}

// waitPIDFile polls until path holds a complete pid line.
func waitPIDFile(t *testing.T, path string) int {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if b, err := os.ReadFile(path); err == nil && len(b) > 1 && b[len(b)-1] == '\n' {
			pid, err := strconv.Atoi(string(b[:len(b)-1]))
			if err != nil {
				t.Fatalf("%s: %v", path, err)
			}
			return pid
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not written in time", path)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
