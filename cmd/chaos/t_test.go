package main

import (
	"bytes"
	"os"
	"slices"
	"strings"
	"testing"
)

func TestRunTCleanupsRunInReverseOnce(t *testing.T) {
	var out bytes.Buffer
	rt := newRunT(&out)
	var order []int
	rt.Cleanup(func() { order = append(order, 1) })
	rt.Cleanup(func() {
		order = append(order, 2)
		rt.Cleanup(func() { order = append(order, 3) }) // registered by a cleanup: still runs
	})
	rt.Cleanup(func() { rt.Fatalf("boom") }) // does not stop the others
	dir := rt.TempDir()
	rt.runCleanups()
	rt.runCleanups()
	if want := []int{2, 3, 1}; !slices.Equal(order, want) {
		t.Errorf("cleanups ran in order %v, want %v", order, want)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("TempDir %s not removed at cleanup: %v", dir, err)
	}
	if !strings.Contains(out.String(), "FATAL: boom") {
		t.Errorf("Fatalf in a cleanup not reported:\n%s", out.String())
	}
}

func TestRunTFatalAndSkipUnwind(t *testing.T) {
	rt := newRunT(&bytes.Buffer{})
	unwind := func(f func()) (r any) {
		defer func() { r = recover() }()
		f()
		return nil
	}
	if r, ok := unwind(func() { rt.Fatal("no", "way") }).(fatalPanic); !ok || r.msg != "no way" {
		t.Errorf("Fatal unwound with %#v, want fatalPanic{no way}", r)
	}
	if !rt.Failed() {
		t.Error("Failed() is false after Fatal")
	}
	if _, ok := unwind(func() { rt.Skip("redis-server not found") }).(skipPanic); !ok {
		t.Error("Skip did not unwind with skipPanic")
	}
}

func TestBadFlagsExit2(t *testing.T) {
	for _, args := range [][]string{{"--duration", "soon"}, {"extra"}} {
		var stdout, stderr bytes.Buffer
		if code := run(args, &stdout, &stderr); code != exitFailed {
			t.Errorf("chaos %v: exit %d, want %d; stderr:\n%s", args, code, exitFailed, stderr.String())
		}
	}
}
