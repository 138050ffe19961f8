//go:build linux

// The runner processes, and the processes they start.

package chaos

import (
	"bufio"
	"bytes"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tasklease/tasklease/internal/redistest"
)

// runnerProc is one incarnation of a `runner serve` process. Every
// process it starts inherits CHAOS_RUNNER=<marker>, unique per incarnation.
type runnerProc struct {
	id, marker, url, logPath string
	inc                      int
	cmd                      *exec.Cmd
	done                     chan struct{}
	err                      error

	ownerOnce sync.Mutex
	owner     string // the scheduler's owner, from the log
}

func (p *runnerProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// schedOwnerRE finds the owner the scheduler logs at start.
var schedOwnerRE = regexp.MustCompile(`component=scheduler owner=(\S+)`)

// schedOwner is the owner this incarnation's scheduler writes into the
// leader mutex ("<id>/<suffix>"), read from its log; "" until it logged it.
func (p *runnerProc) schedOwner() string {
	p.ownerOnce.Lock()
	defer p.ownerOnce.Unlock()
	if p.owner != "" {
		return p.owner
	}
	f, err := os.Open(p.logPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	buf := make([]byte, 256<<10)
	n, _ := f.Read(buf)
	if m := schedOwnerRE.FindSubmatch(buf[:n]); m != nil {
		p.owner = strings.Trim(string(m[1]), `"`)
	}
	return p.owner
}

// tail returns the last n lines of the runner's log.
func (p *runnerProc) tail(n int) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// logErrors returns the panics and ERROR lines of the runner's log.
func (p *runnerProc) logErrors() []string {
	f, err := os.Open(p.logPath)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if l := sc.Text(); strings.Contains(l, "level=ERROR") || strings.HasPrefix(l, "panic") || strings.Contains(l, "DATA RACE") {
			out = append(out, l)
		}
	}
	return out
}

// start starts a new incarnation of runner id with config cfg and waits
// until it is ready.
func (h *harness) start(id, cfg string) *runnerProc {
	t := h.t
	t.Helper()
	for attempt := 1; ; attempt++ {
		h.mu.Lock()
		h.incs++
		inc := h.incs
		h.mu.Unlock()
		addr := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
		p := &runnerProc{id: id, inc: inc, marker: fmt.Sprintf("%s/%s/%d", h.nonce, id, inc), url: "http://" + addr,
			logPath: fmt.Sprintf("%s/runner-%s-%d.log", h.dir, id, inc), done: make(chan struct{})}
		logf, err := os.Create(p.logPath)
		if err != nil {
			t.Fatal(err)
		}
		p.cmd = exec.Command(h.bin, "serve", "--config", cfg, "--listen", addr, "--history-log", h.historyPath(id, inc))
		p.cmd.Env = append(append(os.Environ(), h.topo.runnerEnv()...), "TASKLEASE_RUNNER_ID="+id, "TASKLEASE_TOKEN=",
			"CHAOS_RUNNER="+p.marker, "CHAOS_EXEC_LOG="+h.execLog)
		if h.net != nil {
			env, err := h.net.env(id)
			if err != nil {
				t.Fatalf("chaos: %v", err)
			}
			p.cmd.Env = append(p.cmd.Env, env)
		}
		p.cmd.Stdout, p.cmd.Stderr = logf, logf
		// The kernel SIGKILLs the runner if the harness dies without
		// cleaning up, so no runner outlives it.
		p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := p.cmd.Start(); err != nil {
			t.Fatalf("start %s: %v", id, err)
		}
		go func() { p.err = p.cmd.Wait(); logf.Close(); close(p.done) }()
		t.Cleanup(func() {
			if !p.exited() {
				_ = p.cmd.Process.Signal(syscall.SIGCONT)
				_ = p.cmd.Process.Kill()
				<-p.done
			}
		})
		deadline := time.Now().Add(20 * time.Second)
		for {
			if p.exited() {
				if attempt < 3 && strings.Contains(p.tail(20), "address already in use") {
					break
				}
				t.Fatalf("%s#%d exited before it was ready: %v\n%s", id, inc, p.err, p.tail(40))
			}
			if code, err := h.get(p.url+"/readyz", nil); err == nil && code == http.StatusOK {
				h.mu.Lock()
				h.runners[id] = p
				h.all = append(h.all, p)
				h.mu.Unlock()
				return p
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s#%d not ready within 20s:\n%s", id, inc, p.tail(40))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

func (h *harness) current() []*runnerProc {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]*runnerProc, 0, len(h.ids))
	for _, id := range h.ids {
		if p := h.runners[id]; p != nil {
			out = append(out, p)
		}
	}
	return out
}

// byMarker returns the current runner incarnation with marker m, or nil.
func (h *harness) byMarker(m string) *runnerProc {
	for _, p := range h.current() {
		if m != "" && p.marker == m {
			return p
		}
	}
	return nil
}

func (h *harness) allRunners() []*runnerProc {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.all)
}

// url returns a random current runner's API (it may be stopped or dying:
// callers tolerate errors).
func (h *harness) url(rng *rand.Rand) string {
	cur := h.current()
	return cur[rng.IntN(len(cur))].url
}

// kill SIGKILLs p, checks that every process it started dies with it, and
// starts a new incarnation of the same runner.
func (h *harness) kill(p *runnerProc) {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
	h.kills.Add(1)
	h.logf("SIGKILL %s#%d", p.id, p.inc)
	h.bg.Go(func() { h.checkGone(p, "SIGKILL") })
	time.Sleep(time.Duration(200+h.rng.IntN(500)) * time.Millisecond)
	h.start(p.id, h.cfgCron)
}

// terminate stops p gracefully (SIGTERM) and checks its descendants go too.
func (h *harness) terminate(p *runnerProc) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		h.graceful.Add(1)
	case <-time.After(20 * time.Second):
		h.viol.add(checkStuck, "%s#%d did not exit within 20s of SIGTERM (shutdownGrace 1s); log tail:\n%s", p.id, p.inc, p.tail(30))
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	h.checkGone(p, "SIGTERM")
}

// checkGone waits until no process carries p's marker (a runner's exec
// stages, their supervisors and daemons); 5 s after p's death any left is a
// violation.
func (h *harness) checkGone(p *runnerProc, how string) {
	begin := time.Now()
	first := scanMarked(p.marker, false)
	h.descSeen.Add(int64(len(first)))
	deadline := begin.Add(5 * time.Second)
	for {
		left := scanMarked(p.marker, false)
		if len(left) == 0 {
			if d := int64(time.Since(begin)); d > h.goneMax.Load() {
				h.goneMax.Store(d)
			}
			return
		}
		if time.Now().After(deadline) {
			h.viol.add(checkDescendant, "5s after %s of %s#%d (%d of its processes alive right after it died), %d still alive:\n%s",
				how, p.id, p.inc, len(first), len(left), procList(left))
			killMarked(p.marker, false)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// keepLogs copies the runners' logs and the exec log into dir.
func (h *harness) keepLogs(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("keep logs: %w", err)
	}
	paths := []string{h.execLog}
	for _, p := range h.allRunners() {
		paths = append(paths, p.logPath, h.historyPath(p.id, p.inc))
	}
	for _, p := range paths {
		if b, err := os.ReadFile(p); err == nil {
			_ = os.WriteFile(dir+"/"+p[strings.LastIndexByte(p, '/')+1:], b, 0o644)
		}
	}
	if b, err := os.ReadFile(h.dir + "/histories/histories.html"); err == nil { // check 10's view, when Illegal
		_ = os.MkdirAll(dir+"/histories", 0o755)
		_ = os.WriteFile(dir+"/histories/histories.html", b, 0o644)
	}
	h.note("logs kept in %s", dir)
	return nil
}

// ---------------------------------------------------------------------------
// Processes carrying a runner's marker.

type markedProc struct {
	pid                  int
	marker, key, cmdline string
}

func (m markedProc) String() string {
	return fmt.Sprintf("pid %d [%s] key %q marker %s", m.pid, m.cmdline, m.key, m.marker)
}

// scanMarked lists the live (non-zombie) processes whose environment holds
// CHAOS_RUNNER=<value> with value == marker, or starting with marker when
// prefix is true.
func scanMarked(marker string, prefix bool) []markedProc {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	needle := []byte("CHAOS_RUNNER=" + marker)
	var out []markedProc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil || !bytes.Contains(env, needle) {
			continue
		}
		m := markedProc{pid: pid}
		for _, kv := range bytes.Split(env, []byte{0}) {
			s := string(kv)
			switch {
			case strings.HasPrefix(s, "CHAOS_RUNNER="):
				m.marker = strings.TrimPrefix(s, "CHAOS_RUNNER=")
			case strings.HasPrefix(s, "TASKLEASE_KEY="):
				m.key = strings.TrimPrefix(s, "TASKLEASE_KEY=")
			}
		}
		if m.marker != marker && !(prefix && strings.HasPrefix(m.marker, marker)) {
			continue
		}
		if stat, err := os.ReadFile("/proc/" + e.Name() + "/stat"); err == nil {
			if i := bytes.LastIndexByte(stat, ')'); i > 0 && i+2 < len(stat) && (stat[i+2] == 'Z' || stat[i+2] == 'X') {
				continue // dead, waiting to be reaped
			}
		}
		cmdline, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		m.cmdline = strings.TrimSpace(string(bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '})))
		out = append(out, m)
	}
	return out
}

// killMarked SIGKILLs what scanMarked finds (cleanup after a violation or
// the run: no helper of a broken build may outlive it).
func killMarked(marker string, prefix bool) int {
	ps := scanMarked(marker, prefix)
	for _, p := range ps {
		_ = syscall.Kill(p.pid, syscall.SIGKILL)
	}
	return len(ps)
}

// procList renders up to 12 processes, one a line.
func procList(ps []markedProc) string {
	var b strings.Builder
	for i, m := range ps {
		if i == 12 {
			fmt.Fprintf(&b, "  … and %d more\n", len(ps)-i)
			break
		}
		b.WriteString("  " + m.String() + "\n")
	}
	return b.String()
}
