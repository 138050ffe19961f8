package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// runT is what internal/chaos and internal/redistest need of a test
// (redistest.T), for a command: cleanups run in reverse order, once, at
// the end or on SIGINT/SIGTERM; Fatal and Skip unwind the calling goroutine
// with a panic that main recovers (so, as with testing.T, they must be
// called from the goroutine running the chaos run).
type runT struct {
	start time.Time

	outMu sync.Mutex // one line at a time on out
	out   io.Writer

	mu       sync.Mutex
	cleanups []func()
	failed   bool

	cleanOnce sync.Once
}

// fatalPanic unwinds a Fatal; its message has been printed.
type fatalPanic struct{ msg string }

// skipPanic unwinds a Skip: something the run needs is missing.
type skipPanic struct{ msg string }

func newRunT(out io.Writer) *runT { return &runT{start: time.Now(), out: out} }

func (t *runT) Helper() {}

func (t *runT) Cleanup(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.cleanups = append(t.cleanups, f)
}

func (t *runT) Failed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.failed
}

func (t *runT) fail() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.failed = true
}

func (t *runT) Fatal(args ...any) { t.fatal(sprintln(args...)) }

func (t *runT) Fatalf(format string, args ...any) { t.fatal(fmt.Sprintf(format, args...)) }

func (t *runT) fatal(msg string) {
	t.fail()
	t.Logf("FATAL: %s", msg)
	panic(fatalPanic{msg: msg})
}

func (t *runT) Log(args ...any) { t.Logf("%s", sprintln(args...)) }

// Logf prints a line to out with the time since the command started.
func (t *runT) Logf(format string, args ...any) {
	msg := strings.TrimSuffix(fmt.Sprintf(format, args...), "\n")
	t.outMu.Lock()
	defer t.outMu.Unlock()
	fmt.Fprintf(t.out, "chaos [%6.1fs] %s\n", time.Since(t.start).Seconds(), msg)
}

func (t *runT) Skip(args ...any) { panic(skipPanic{msg: sprintln(args...)}) }

// TempDir returns a new directory, removed at cleanup.
func (t *runT) TempDir() string {
	dir, err := os.MkdirTemp("", "tasklease-chaos-")
	if err != nil {
		t.Fatalf("temp dir: %v", err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// runCleanups runs the cleanups, last registered first, each once (also
// those a cleanup registers). A second caller waits for the first to end.
func (t *runT) runCleanups() {
	t.cleanOnce.Do(func() {
		for {
			t.mu.Lock()
			n := len(t.cleanups)
			if n == 0 {
				t.mu.Unlock()
				return
			}
			f := t.cleanups[n-1]
			t.cleanups = t.cleanups[:n-1]
			t.mu.Unlock()
			t.runCleanup(f)
		}
	})
}

// runCleanup runs f; a Fatal or panic in it does not stop the others.
func (t *runT) runCleanup(f func()) {
	defer func() {
		if r := recover(); r != nil {
			if _, ok := r.(fatalPanic); !ok {
				t.Logf("cleanup panicked: %v", r)
			}
		}
	}()
	f()
}

// sprintln formats as testing.T.Log does (operands separated by spaces).
func sprintln(args ...any) string {
	return strings.TrimSuffix(fmt.Sprintln(args...), "\n")
}
