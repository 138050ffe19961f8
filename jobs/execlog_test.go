//go:build unix

package jobs

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/tasklease/tasklease/checkpoints"
	"github.com/tasklease/tasklease/leasing"
	"github.com/tasklease/tasklease/taskkey"
)

// syncBuffer is a bytes.Buffer safe for the exec output goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// An exec stage with a Logger logs every output line with the run's
// attributes, including a last line without a newline, and still keeps the
// stderr tail for the error.
func TestExecStageLogsOutputLines(t *testing.T) {
	var logs syncBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	k := taskkey.MustNew("u42", "course_sync")
	run := &Run{key: k, runID: "r1", attempt: 2, source: SourceManual,
		lease: leasing.Lease{Key: k, Owner: "pod-a/x", Token: 7}, recovery: checkpoints.Recovery{Mode: checkpoints.Restart},
		stage: "pulling"}
	st := &ExecStage{Command: []string{"sh", "-c", "echo one; echo two; echo oops >&2; printf tail; exit 3"}, Logger: log}
	err := st.RunStage(context.Background(), run)
	if err == nil || !strings.Contains(err.Error(), "exit 3") || !strings.Contains(err.Error(), "oops") {
		t.Fatalf("err = %v, want exit 3 with the stderr tail", err)
	}
	out := logs.String()
	for _, want := range []string{
		`level=INFO msg="exec output" task_key=u42|course_sync run_id=r1 stage=pulling attempt=2 fencing_token=7 stream=stdout line=one`,
		`stream=stdout line=two`,
		`level=WARN msg="exec output"`,
		`stream=stderr line=oops`,
		`stream=stdout line=tail`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
}
