package supervisor

import (
	"io"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestArgsRoundTrip(t *testing.T) {
	for _, o := range []Options{
		{Grace: 1500 * time.Millisecond, ParentPID: 42, StatusFD: 3, Path: "/bin/sh", Dir: "/tmp/a b", Argv: []string{"sh", "-c", "echo -- --grace=1s"}},
		{Grace: 0, StatusFD: -1, Argv: []string{"true"}},
		{Grace: time.Minute, StatusFD: 0, Argv: []string{"--", "--path=x"}},
	} {
		a := o.Args()
		got, err := ParseArgs(a)
		if err != nil {
			t.Fatalf("ParseArgs(%q): %v", a, err)
		}
		if got.Grace != o.Grace || got.ParentPID != o.ParentPID || got.StatusFD != o.StatusFD || got.Path != o.Path || got.Dir != o.Dir || !slices.Equal(got.Argv, o.Argv) {
			t.Errorf("round trip of %+v via %q = %+v", o, a, got)
		}
	}
}

func TestParseArgsDefaultsAndErrors(t *testing.T) {
	o, err := ParseArgs([]string{"--", "sleep", "1"})
	if err != nil || o.Grace != DefaultGrace || o.StatusFD != -1 || o.ParentPID != 0 || o.Path != "" {
		t.Errorf("defaults: %+v, %v", o, err)
	}
	for _, a := range [][]string{
		nil,
		{"sleep", "1"},
		{"--grace=1s"},
		{"--"},
		{"--", ""},
		{"--grace=soon", "--", "x"},
		{"--grace=-1s", "--", "x"},
		{"--status-fd=-3", "--", "x"},
		{"--ppid=me", "--", "x"},
		{"--color=red", "--", "x"},
		{"--grace", "1s", "--", "x"},
	} {
		if _, err := ParseArgs(a); err == nil {
			t.Errorf("ParseArgs(%q) accepted", a)
		}
	}
}

func TestReadStatus(t *testing.T) {
	st, err := ReadStatus(strings.NewReader("started 123\nsignal 9\n"), nil)
	if err != nil || !st.Started || st.PID != 123 || !st.Ended || st.Signal != syscall.SIGKILL || st.Code != 0 {
		t.Errorf("signal: %+v, %v", st, err)
	}
	st, err = ReadStatus(strings.NewReader("started 7\nexit 137\n"), nil)
	if err != nil || !st.Ended || st.Signal != 0 || st.Code != 137 {
		t.Errorf("exit: %+v, %v", st, err)
	}
	st, err = ReadStatus(strings.NewReader("start-error 2\n"), nil)
	if err != nil || st.Started || st.Ended || st.StartErr != syscall.ENOENT {
		t.Errorf("start-error: %+v, %v", st, err)
	}
	st, err = ReadStatus(strings.NewReader("started 7\n"), nil)
	if err != nil || !st.Started || st.Ended {
		t.Errorf("no end: %+v, %v", st, err)
	}
	st, err = ReadStatus(strings.NewReader("started 7\nhello world\nexit 0\n"), nil)
	if err == nil || !st.Ended || st.Code != 0 {
		t.Errorf("bad line: %+v, %v; want the rest read and an error", st, err)
	}
}

// onFirst comes once, as soon as the first line is read — before the rest
// of the status arrives — or at the end when there is no line.
func TestReadStatusOnFirst(t *testing.T) {
	r, w := io.Pipe()
	first := make(chan struct{}, 2)
	done := make(chan struct{})
	go func() {
		_, _ = ReadStatus(r, func() { first <- struct{}{} })
		close(done)
	}()
	_, _ = io.WriteString(w, "started 7\n")
	select {
	case <-first:
	case <-time.After(10 * time.Second):
		t.Fatal("onFirst not called at the first line")
	}
	_, _ = io.WriteString(w, "exit 0\n")
	w.Close()
	<-done
	if len(first) != 0 {
		t.Error("onFirst called more than once")
	}
	called := 0
	_, _ = ReadStatus(strings.NewReader(""), func() { called++ })
	if called != 1 {
		t.Errorf("onFirst called %d times on an empty status, want 1", called)
	}
}
