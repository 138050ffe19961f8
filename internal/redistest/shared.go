package redistest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/redis/go-redis/v9"
)

// A shared cluster serves every test of one test binary that asks for it
// (SharedCluster, or Backends with WithSharedCluster), so a package whose
// tests each want "also on a cluster" pays for one cluster (about 2–3 s and
// 3 processes) instead of one per test.
//
// Rules for tests on it: use a key prefix no other test of the binary
// uses, and leave the cluster as found — no FLUSHALL, FUNCTION FLUSH,
// SCRIPT FLUSH, CONFIG SET, killing or pausing nodes. A test that needs any
// of that starts its own cluster (StartCluster). Each test still gets its
// own ClusterClient (Cluster.Client), so hooks added to it stay its own.
// Keys outlive the test, so under go test -count=N a rerun would find them:
// a test deletes its keys when it ends (jobs' newEnv does, for clients
// that OnSharedCluster recognises).
//
// The cluster starts with the first SharedCluster call and lives until
// StopShared, which a package's TestMain calls after m.Run:
//
//	func TestMain(m *testing.M) {
//		code := m.Run()
//		redistest.StopShared()
//		os.Exit(code)
//	}
//
// Without that call the kernel still SIGKILLs the nodes when the test
// binary exits (Pdeathsig, on Linux: the nodes are forked from a thread
// kept alive for exactly that), and the next binary to start a shared
// cluster removes the leftover directory.
var shared struct {
	mu sync.Mutex
	g  *sharedGen // nil until the first SharedCluster call, and after StopShared
}

// sharedGen is one shared cluster's life, from its start to StopShared.
type sharedGen struct {
	pt      *processT
	ready   chan struct{} // closed once the start succeeded or failed
	stop    chan struct{} // closed by StopShared
	exited  chan struct{} // closed once the nodes are stopped
	cluster *Cluster      // set before ready is closed, when the start succeeded
}

// sharedDirPrefix starts the name of a shared cluster's directory, followed
// by the pid of its test binary, so a later binary can tell whether the
// owner is gone.
const sharedDirPrefix = "redistest-shared-"

// SharedCluster returns the test binary's shared 3-master cluster (see the
// rules above), starting it on the first call. Like StartCluster it skips
// the test when redis-server or redis-cli is missing, unless
// TASKLEASE_REQUIRE_REDIS=1. A failed start fails this and every later
// caller with the same error, without retrying.
func SharedCluster(t T) *Cluster {
	t.Helper()
	requireBinary(t, "redis-server")
	requireBinary(t, "redis-cli")

	shared.mu.Lock()
	g := shared.g
	if g == nil {
		g = &sharedGen{pt: &processT{}, ready: make(chan struct{}), stop: make(chan struct{}), exited: make(chan struct{})}
		shared.g = g
		go g.run()
	}
	shared.mu.Unlock()

	<-g.ready
	if msg, skipped := g.pt.outcome(); msg != "" {
		if skipped {
			t.Skip("redistest: shared cluster: " + msg)
		}
		t.Fatalf("redistest: shared cluster: %s", msg)
	}
	return g.cluster
}

// OnSharedCluster reports whether rdb is a client of the shared cluster
// (made by its Cluster.Client), e.g. for a test helper that must clean up
// after itself there only.
func OnSharedCluster(rdb redis.UniversalClient) bool {
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok {
		return false
	}
	shared.mu.Lock()
	g := shared.g
	shared.mu.Unlock()
	if g == nil {
		return false
	}
	select {
	case <-g.ready:
	default:
		return false // still starting: no client of it exists yet
	}
	return g.cluster != nil && slices.Equal(cc.Options().Addrs, g.cluster.Addrs())
}

// run starts the cluster and keeps its nodes' parent thread alive until
// StopShared.
func (g *sharedGen) run() {
	// Pdeathsig fires when the thread that forked a node exits, and the Go
	// runtime may retire an unlocked thread; this goroutine stays locked to
	// its thread until the nodes are stopped. (It never unlocks: a goroutine
	// that exits locked takes its thread with it, which is fine here.)
	runtime.LockOSThread()
	defer close(g.exited)
	defer g.pt.cleanup()
	started := false
	defer func() {
		if !started { // Fatal or Skip ended this goroutine (runtime.Goexit)
			close(g.ready)
		}
	}()
	sweepSharedDirs()
	g.cluster = StartClusterWith(g.pt, ClusterOptions{})
	started = true
	close(g.ready)
	<-g.stop
}

// StopShared stops the shared cluster, if one was started, and removes its
// files; a later SharedCluster call starts a new one. Call it from
// TestMain after m.Run, when no test uses the cluster any more.
func StopShared() {
	shared.mu.Lock()
	g := shared.g
	shared.g = nil
	shared.mu.Unlock()
	if g == nil {
		return
	}
	<-g.ready
	close(g.stop)
	<-g.exited
}

// sweepSharedDirs removes the directories of shared clusters whose test
// binary is gone (it ended without StopShared).
func sweepSharedDirs() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), sharedDirPrefix+"*"))
	for _, d := range dirs {
		pidText, _, _ := strings.Cut(strings.TrimPrefix(filepath.Base(d), sharedDirPrefix), "-")
		pid, err := strconv.Atoi(pidText)
		if err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if errors.Is(syscall.Kill(pid, 0), syscall.ESRCH) {
			_ = os.RemoveAll(d)
		}
	}
}

// processT is the T a shared cluster is started with: it lives as long as
// the cluster, not as long as the test that happened to ask first. Fatal
// and Skip record why and end the calling goroutine (runtime.Goexit, as
// testing.T does); Cleanup functions run, last first, at cleanup.
type processT struct {
	mu       sync.Mutex
	cleanups []func()
	msg      string
	failed   bool
	skipped  bool
}

func (p *processT) Helper() {}

func (p *processT) Cleanup(f func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cleanups = append(p.cleanups, f)
}

func (p *processT) Failed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.failed
}

func (p *processT) Fatal(args ...any) { p.end(false, fmt.Sprint(args...)) }

func (p *processT) Fatalf(format string, args ...any) { p.end(false, fmt.Sprintf(format, args...)) }

func (p *processT) Skip(args ...any) { p.end(true, fmt.Sprint(args...)) }

func (p *processT) end(skip bool, msg string) {
	p.mu.Lock()
	if p.msg == "" {
		p.msg, p.skipped = msg, skip
	}
	p.failed = p.failed || !skip
	p.mu.Unlock()
	runtime.Goexit()
}

// Log and Logf go to stderr: only failure diagnostics (a node's log) are
// logged, and there is no test to attach them to.
func (p *processT) Log(args ...any) { fmt.Fprintln(os.Stderr, args...) }

func (p *processT) Logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, format+"\n", args...)
}

func (p *processT) TempDir() string {
	dir, err := os.MkdirTemp("", sharedDirPrefix+strconv.Itoa(os.Getpid())+"-")
	if err != nil {
		p.Fatalf("redistest: shared cluster directory: %v", err)
	}
	p.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// outcome returns why the start failed or was skipped ("" if it did not).
func (p *processT) outcome() (msg string, skipped bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.msg, p.skipped
}

// cleanup runs the Cleanup functions, last registered first.
func (p *processT) cleanup() {
	p.mu.Lock()
	fs := slices.Clone(p.cleanups)
	p.cleanups = nil
	p.mu.Unlock()
	for _, f := range slices.Backward(fs) {
		f()
	}
}
