// Package redistest starts Redis backends for tests: real redis-server
// processes (single node or a 3-master cluster) and miniredis with a
// controllable clock.
//
// Tests that need a real redis-server are skipped when the binary is missing,
// so `go test ./...` works on a bare machine. CI sets
// TASKLEASE_REQUIRE_REDIS=1 so that a missing binary fails instead of
// silently skipping the tests that matter most.
package redistest

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

const (
	// requireEnv makes a missing redis-server fatal instead of a skip.
	requireEnv = "TASKLEASE_REQUIRE_REDIS"

	// startTimeout bounds how long one redis-server launch may take to
	// answer PING; startup is normally a few milliseconds.
	startTimeout = 10 * time.Second

	// stopTimeout bounds a graceful SIGTERM shutdown before we SIGKILL.
	stopTimeout = 10 * time.Second

	// portAttempts is the first launch plus up to 3 retries: FreePort closes
	// its listener before redis-server binds, so another process can grab the
	// port in between.
	portAttempts = 4

	// pollStep is the interval between readiness probes.
	pollStep = 10 * time.Millisecond
)

// T is what this package needs of a test: testing.TB satisfies it, and the
// chaos command (internal/chaos) passes its own, so the same servers,
// Sentinels and Clusters serve tests and a user's chaos run.
type T interface {
	Helper()
	Cleanup(func())
	Failed() bool
	Fatal(args ...any)
	Fatalf(format string, args ...any)
	Log(args ...any)
	Logf(format string, args ...any)
	Skip(args ...any)
	TempDir() string
}

// RequireRedis reports whether TASKLEASE_REQUIRE_REDIS=1, i.e. whether a
// missing redis-server must fail the test rather than skip it.
func RequireRedis() bool {
	return os.Getenv(requireEnv) == "1"
}

// FreePort returns a loopback TCP port that was free a moment ago. The port is
// released before returning, so callers must tolerate losing the race for it.
func FreePort(t T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("redistest: find free port: %v", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		t.Fatalf("redistest: release free port: %v", err)
	}
	return port
}

// lookBinary finds name on PATH. When it is missing it returns a reason
// suitable for t.Skip/t.Log, and fails the test outright if RequireRedis.
func lookBinary(t T, name string) (path, missing string) {
	t.Helper()
	path, err := exec.LookPath(name)
	if err == nil {
		return path, ""
	}
	if RequireRedis() {
		t.Fatalf("redistest: %s not found on PATH and %s=1: %v", name, requireEnv, err)
	}
	return "", fmt.Sprintf("%s not found on PATH (set %s=1 to make this fatal)", name, requireEnv)
}

// requireBinary is lookBinary that skips the test when the binary is missing.
func requireBinary(t T, name string) string {
	t.Helper()
	path, missing := lookBinary(t, name)
	if missing != "" {
		t.Skip("redistest: " + missing)
	}
	return path
}

// LogBuffer collects a process's stdout/stderr. It is locked because
// os/exec copies output from its own goroutine while tests read it.
type LogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// since returns what was written after offset, to inspect one launch only.
func (b *LogBuffer) since(offset int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if offset > b.buf.Len() {
		return ""
	}
	return string(b.buf.Bytes()[offset:])
}

func (b *LogBuffer) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Len()
}

// errPortInUse marks a launch that lost the race for its port, which is
// worth retrying on another port.
var errPortInUse = errors.New("port already in use")

// Server is a real redis-server process started for one test on a free
// loopback port.
type Server struct {
	bin       string
	dir       string
	extraArgs func(port int) []string // cluster flags; nil for a plain server
	// confFile, when set, writes the config file redis-server is given as
	// its first argument (Sentinel needs one it can rewrite).
	confFile func(port int) (string, error)
	log      *LogBuffer
	env      []string // added to the process's environment (Clock)
	clock    *Clock   // nil: the host's

	mu     sync.Mutex // serialises lifecycle calls from test goroutines
	port   int
	proc   *os.Process
	done   chan struct{} // closed once the current process has been reaped
	paused bool
}

// StartServer starts a redis-server bound to 127.0.0.1 on a free port with
// persistence disabled, and waits until it answers PING. It skips the test
// when redis-server is not on PATH, unless TASKLEASE_REQUIRE_REDIS=1. The
// server is stopped when the test ends.
func StartServer(t T) *Server {
	t.Helper()
	bin := requireBinary(t, "redis-server")
	s := newServer(t, bin, t.TempDir(), nil)
	s.startOnFreePort(t, func(t T) int { return FreePort(t) })
	return s
}

func newServer(t T, bin, dir string, extraArgs func(int) []string) *Server {
	s := &Server{bin: bin, dir: dir, extraArgs: extraArgs, log: &LogBuffer{}}
	t.Cleanup(func() {
		s.Stop()
		// The server log is the first thing one wants when a test against
		// it fails, and it is lost with the temp dir otherwise.
		if t.Failed() {
			t.Logf("redistest: redis-server %s log:\n%s", s.Addr(), s.log.String())
		}
	})
	return s
}

// startOnFreePort launches on ports from pick, moving to a new port when the
// chosen one was taken between pick and bind.
func (s *Server) startOnFreePort(t T, pick func(T) int) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	var err error
	for range portAttempts {
		if err = s.launchLocked(pick(t)); !errors.Is(err, errPortInUse) {
			break
		}
	}
	if err != nil {
		t.Fatalf("redistest: start redis-server: %v\nlog:\n%s", err, s.log.String())
	}
}

// Addr returns "127.0.0.1:PORT".
func (s *Server) Addr() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addrLocked()
}

func (s *Server) addrLocked() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port))
}

// Client returns a new go-redis client for the server, closed when the test
// ends. It keeps working across Restart because go-redis redials.
func (s *Server) Client(t T) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Stop shuts the server down with SIGTERM and waits for it to exit. It is a
// no-op when the server is not running.
func (s *Server) Stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.runningLocked() {
		return
	}
	_ = s.proc.Signal(syscall.SIGTERM)
	// A stopped (paused) process only acts on SIGTERM once continued.
	_ = s.proc.Signal(syscall.SIGCONT)
	s.paused = false
	select {
	case <-s.done:
	case <-time.After(stopTimeout):
		// Don't let a wedged shutdown hang the test binary.
		s.killLocked()
	}
}

// Kill terminates the server with SIGKILL and waits for it to exit,
// simulating a crash or an unreachable Redis. It is a no-op when the server
// is not running.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.runningLocked() {
		s.killLocked()
	}
}

func (s *Server) killLocked() {
	_ = s.proc.Kill()
	<-s.done
	s.paused = false
}

func (s *Server) runningLocked() bool {
	if s.proc == nil {
		return false
	}
	select {
	case <-s.done:
		return false
	default:
		return true
	}
}

// Restart starts the server again on the same port after Stop or Kill, and
// waits until it answers PING. Data is not preserved.
func (s *Server) Restart(t T) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.runningLocked() {
		t.Fatalf("redistest: Restart of %s while it is running; call Stop or Kill first", s.addrLocked())
	}
	// Same port on purpose: clients configured with the old address must
	// reconnect, so no retry on another port here.
	if err := s.launchLocked(s.port); err != nil {
		t.Fatalf("redistest: restart redis-server on %s: %v\nlog:\n%s", s.addrLocked(), err, s.log.String())
	}
}

// Pause freezes the process with SIGSTOP: connections stay open but Redis
// stops answering, as with a hung or partitioned server.
func (s *Server) Pause() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.runningLocked() {
		_ = s.proc.Signal(syscall.SIGSTOP)
		s.paused = true
	}
}

// Resume continues a paused server with SIGCONT.
func (s *Server) Resume() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.runningLocked() {
		_ = s.proc.Signal(syscall.SIGCONT)
		s.paused = false
	}
}

// launchLocked starts redis-server on port and waits for PING. On failure
// the process is reaped; errPortInUse is returned when the bind lost a race.
func (s *Server) launchLocked(port int) error {
	args := []string{
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		// Pure in-memory: nothing to write, nothing to load on restart.
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
	}
	if s.extraArgs != nil {
		args = append(args, s.extraArgs(port)...)
	}
	if s.confFile != nil {
		conf, err := s.confFile(port)
		if err != nil {
			return err
		}
		args = append([]string{conf}, args...)
	}
	fmt.Fprintf(s.log, "--- redistest: starting redis-server on port %d ---\n", port)
	mark := s.log.Len()

	cmd := exec.Command(s.bin, args...)
	cmd.Stdout = s.log
	cmd.Stderr = s.log
	cmd.SysProcAttr = sysProcAttr()
	if s.env != nil {
		cmd.Env = append(os.Environ(), s.env...)
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	s.port, s.proc, s.done, s.paused = port, cmd.Process, done, false

	if err := waitPing(s.addrLocked(), done, startTimeout); err != nil {
		s.killLocked()
		if strings.Contains(s.log.since(mark), "Address already in use") {
			return fmt.Errorf("%w: %d: %v", errPortInUse, port, err)
		}
		return err
	}
	return nil
}

// waitPing polls addr until it answers PING, the process exits (exited is
// closed), or timeout passes.
func waitPing(addr string, exited <-chan struct{}, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var lastErr error
	for {
		if lastErr = ping(addr); lastErr == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("redis-server exited before answering PING on %s (last error: %v)", addr, lastErr)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on %s did not answer PING within %v: %v", addr, timeout, lastErr)
		}
		select {
		case <-exited:
		case <-time.After(pollStep):
		}
	}
}

// ping sends an inline PING over a raw connection. It avoids go-redis so
// readiness probes don't depend on client handshakes or log retry noise.
func ping(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(500 * time.Millisecond)); err != nil {
		return err
	}
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	if line = strings.TrimSpace(line); line != "+PONG" {
		// e.g. -LOADING while a dataset is being read.
		return fmt.Errorf("PING answered %q", line)
	}
	return nil
}

// miniStart is the fixed time a Mini clock starts at, so tests are
// reproducible regardless of wall-clock time.
var miniStart = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Mini wraps miniredis with a controllable clock so Redis TIME and key TTLs
// move together.
type Mini struct {
	*miniredis.Miniredis

	mu  sync.Mutex // Advance may be called from several goroutines
	now time.Time
}

// StartMini starts a miniredis whose clock is frozen at 2026-01-01T00:00:00Z
// and only moves with Advance. It is closed when the test ends.
func StartMini(t T) *Mini {
	t.Helper()
	mr, err := miniredis.Run()
	if err != nil {
		t.Fatalf("redistest: start miniredis: %v", err)
	}
	t.Cleanup(mr.Close)
	m := &Mini{Miniredis: mr, now: miniStart}
	// SetTime before ClockTTL so the TTL baseline is the fixed start time,
	// not the wall clock.
	mr.SetTime(m.now)
	mr.ClockTTL(true)
	return m
}

// Client returns a new go-redis client for the miniredis, closed when the
// test ends.
func (m *Mini) Client(t T) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Advance moves the clock forward by d. Because ClockTTL is on, TTLs expire
// coherently with TIME and (P)EXPIREAT. Safe for concurrent use.
func (m *Mini) Advance(d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.now = m.now.Add(d)
	m.SetTime(m.now)
}

// Now returns the current fake time, as also reported by TIME.
func (m *Mini) Now() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.now
}

// Backend lets a test run the same body against miniredis and real Redis.
type Backend struct {
	Name   string // "miniredis", "redis" or "cluster"
	Client redis.UniversalClient
	// Advance makes d of Redis time pass. On miniredis it moves the fake
	// clock instantly; on real Redis it waits for real time to pass.
	Advance func(d time.Duration)
	Real    bool // true for a real redis-server
}

// BackendOption adds backends to Backends.
type BackendOption int

const (
	// WithCluster adds a real 3-master Redis Cluster, reached through a
	// go-redis ClusterClient ("cluster").
	WithCluster BackendOption = iota + 1
	// WithSharedCluster adds the test binary's shared 3-master cluster
	// (SharedCluster), with a ClusterClient of the test's own ("cluster").
	// The test must follow the shared cluster's rules: a key prefix of its
	// own, no flushes. With WithCluster too, the test's own cluster wins.
	WithSharedCluster
)

// Backends returns miniredis and, when redis-server is on PATH, a real
// redis-server (and with WithCluster or WithSharedCluster a real
// cluster). Without the binary only miniredis is returned and the test
// logs why, unless TASKLEASE_REQUIRE_REDIS=1, which fails the test.
func Backends(t *testing.T, opts ...BackendOption) []Backend {
	t.Helper()
	m := StartMini(t)
	backends := []Backend{{
		Name:    "miniredis",
		Client:  m.Client(t),
		Advance: m.Advance,
	}}
	if _, missing := lookBinary(t, "redis-server"); missing != "" {
		t.Log("redistest: only miniredis: " + missing)
		return backends
	}
	s := StartServer(t)
	backends = append(backends, Backend{
		Name:    "redis",
		Client:  s.Client(t),
		Advance: waitReal,
		Real:    true,
	})
	var cluster *Cluster
	switch {
	case slices.Contains(opts, WithCluster):
		cluster = StartCluster(t)
	case slices.Contains(opts, WithSharedCluster):
		cluster = SharedCluster(t)
	}
	if cluster != nil {
		backends = append(backends, Backend{
			Name:    "cluster",
			Client:  cluster.Client(t),
			Advance: waitReal,
			Real:    true,
		})
	}
	return backends
}

// waitReal lets d of wall-clock time pass, which is how time moves on a real
// Redis. Sleeping is the point here (it is the clock, not a wait for some
// state), so a polling sleep loop is acceptable. It waits one millisecond
// more than d because Redis expires a key only once now > deadline in
// milliseconds, while miniredis expires at TTL <= 0; the extra millisecond
// makes Advance(ttl) expire a key on both backends.
func waitReal(d time.Duration) {
	if d <= 0 {
		return
	}
	const step = 5 * time.Millisecond
	start := time.Now() // monotonic, so wall-clock jumps don't matter
	target := d + time.Millisecond
	for {
		left := target - time.Since(start)
		if left <= 0 {
			return
		}
		time.Sleep(min(left, step))
	}
}
