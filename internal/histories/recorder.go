package histories

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// Recorder collects operations from many goroutines, timed by the host's
// monotonic clock.
type Recorder struct {
	start   time.Time
	mu      sync.Mutex
	ops     []porcupine.Operation
	clients map[string]int
}

// NewRecorder returns an empty recorder.
func NewRecorder() *Recorder {
	return &Recorder{start: time.Now(), clients: map[string]int{}}
}

// Add records op, called at call and answered with out at ret (Unknown:
// ret is ignored, the call stays open to the end of the history).
func (r *Recorder) Add(op Op, out Outcome, call, ret time.Time) {
	o := porcupine.Operation{Input: op, Output: out, Call: call.Sub(r.start).Nanoseconds(), Return: ret.Sub(r.start).Nanoseconds()}
	if out == Unknown {
		o.Return = math.MaxInt64
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	id, ok := r.clients[op.Runner]
	if !ok {
		id = len(r.clients)
		r.clients[op.Runner] = id
	}
	o.ClientId = id
	r.ops = append(r.ops, o)
}

// Result is a check's verdict.
type Result struct {
	Verdict porcupine.CheckResult // Ok, Illegal, or Unknown (timed out)
	Ops     int
	Keys    int
	Unknown int    // operations whose outcome was never confirmed
	HTML    string // porcupine's visualisation, written when Illegal
}

func (res Result) String() string {
	s := fmt.Sprintf("histories: %d operations on %d keys (%d unconfirmed): %s", res.Ops, res.Keys, res.Unknown, res.Verdict)
	if res.HTML != "" {
		s += ", see " + res.HTML
	}
	return s
}

// Check checks the recorded history within timeout. When it is not
// linearizable and dir is not "", porcupine's visualisation is written to
// dir/histories.html.
func (r *Recorder) Check(timeout time.Duration, dir string) (Result, error) {
	r.mu.Lock()
	ops := append([]porcupine.Operation(nil), r.ops...)
	r.mu.Unlock()
	return Check(ops, timeout, dir)
}

// Check is Recorder.Check of ops.
func Check(ops []porcupine.Operation, timeout time.Duration, dir string) (Result, error) {
	m := Model()
	verdict, info := porcupine.CheckOperationsVerbose(m, ops, timeout)
	res := Result{Verdict: verdict, Ops: len(ops)}
	keys := map[string]bool{}
	for _, o := range ops {
		keys[o.Input.(Op).Key] = true
		if o.Output.(Outcome) == Unknown {
			res.Unknown++
		}
	}
	res.Keys = len(keys)
	if verdict == porcupine.Illegal && dir != "" {
		res.HTML = filepath.Join(dir, "histories.html")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return res, err
		}
		if err := porcupine.VisualizePath(m, info, res.HTML); err != nil {
			return res, fmt.Errorf("histories: visualisation: %w", err)
		}
	}
	return res, nil
}
