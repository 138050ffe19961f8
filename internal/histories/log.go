package histories

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// A history log is what one runner process saw, one JSON line per event,
// timed by the host's wall clock (shared by the processes of one host;
// a process's monotonic readings are not): a line when a write is sent
// (pending), and one when its answer came. A pending line without its
// answer is a call whose outcome nobody learnt: the process died, or the
// reply never came. Grants are written when they are known, answered.
type logLine struct {
	Pending bool   `json:"pending,omitempty"`
	Key     string `json:"key"`
	Kind    string `json:"kind"`
	Runner  string `json:"runner"`
	RunID   string `json:"runId"`
	Token   int64  `json:"token,omitempty"`
	Done    int    `json:"done,omitempty"`
	Ends    bool   `json:"ends,omitempty"`
	Out     string `json:"out,omitempty"` // ok, refused, unknown
	Call    int64  `json:"call"`          // Unix ns
	Ret     int64  `json:"ret,omitempty"` // Unix ns
}

var (
	kindNames    = map[Kind]string{Grant: "grant", Advance: "advance", Finish: "finish"}
	outcomeNames = map[Outcome]string{OK: "ok", Refused: "refused", Unknown: "unknown"}
)

// Log writes a history log to w; safe for concurrent use. Errors writing
// are dropped: the log is evidence for a test, never in the way of the
// runner.
type Log struct {
	mu sync.Mutex
	w  io.Writer
}

// NewLog returns a log writing to w.
func NewLog(w io.Writer) *Log { return &Log{w: w} }

// Sent records that op was sent at call.
func (l *Log) Sent(op Op, call time.Time) {
	l.write(logLine{Pending: true, Key: op.Key, Kind: kindNames[op.Kind], Runner: op.Runner, RunID: op.RunID,
		Token: op.Token, Done: op.Done, Call: call.UnixNano()})
}

// Returned records op, sent at call, answered with out at ret.
func (l *Log) Returned(op Op, out Outcome, call, ret time.Time) {
	l.write(logLine{Key: op.Key, Kind: kindNames[op.Kind], Runner: op.Runner, RunID: op.RunID, Token: op.Token,
		Done: op.Done, Ends: op.Ends, Out: outcomeNames[out], Call: call.UnixNano(), Ret: ret.UnixNano()})
}

func (l *Log) write(line logLine) {
	b, err := json.Marshal(line)
	if err != nil {
		return
	}
	b = append(b, '\n')
	l.mu.Lock()
	defer l.mu.Unlock()
	_, _ = l.w.Write(b) // one write a line: a process killed mid-log leaves at most a torn last line
}

// Entry is one operation read from a history log, with its times in Unix
// ns (Ret math.MaxInt64 for a call never answered).
type Entry struct {
	Op        Op
	Out       Outcome
	Call, Ret int64
}

// ReadLog reads a history log. A pending call without its answer is
// Unknown, open to the end of the history; a torn last line (the process
// was killed while writing it) is ignored.
func ReadLog(r io.Reader) ([]Entry, error) {
	type callID struct {
		key, kind, run string
		token          int64
		done           int
		call           int64
	}
	var out []Entry
	pending := map[callID]int{} // → index in out
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	var torn error
	for n := 1; sc.Scan(); n++ {
		if torn != nil {
			return nil, torn // a bad line that was not the last
		}
		var l logLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			torn = fmt.Errorf("histories: log line %d: %w", n, err)
			continue
		}
		kind, ok := kindOf(l.Kind)
		if !ok {
			return nil, fmt.Errorf("histories: log line %d: kind %q", n, l.Kind)
		}
		id := callID{l.Key, l.Kind, l.RunID, l.Token, l.Done, l.Call}
		op := Op{Key: l.Key, Kind: kind, Runner: l.Runner, RunID: l.RunID, Token: l.Token, Done: l.Done, Ends: l.Ends}
		if l.Pending {
			// A finish's Ends is known only from its answer. Unanswered,
			// it counts as not ending the run: an ended run only allows
			// less, so nothing legal is lost.
			pending[id] = len(out)
			out = append(out, Entry{Op: op, Out: Unknown, Call: l.Call, Ret: math.MaxInt64})
			continue
		}
		res, ok := outcomeOf(l.Out)
		if !ok {
			return nil, fmt.Errorf("histories: log line %d: outcome %q", n, l.Out)
		}
		e := Entry{Op: op, Out: res, Call: l.Call, Ret: l.Ret}
		if res == Unknown {
			e.Ret = math.MaxInt64
		}
		if i, ok := pending[id]; ok {
			out[i] = e
			delete(pending, id)
			continue
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("histories: read log: %w", err)
	}
	return out, nil
}

func kindOf(s string) (Kind, bool) {
	for k, n := range kindNames {
		if n == s {
			return k, true
		}
	}
	return 0, false
}

func outcomeOf(s string) (Outcome, bool) {
	for o, n := range outcomeNames {
		if n == s {
			return o, true
		}
	}
	return 0, false
}

// Operations turns entries into porcupine's operations, one client per
// runner.
func Operations(entries []Entry) []porcupine.Operation {
	clients := map[string]int{}
	ops := make([]porcupine.Operation, 0, len(entries))
	for _, e := range entries {
		id, ok := clients[e.Op.Runner]
		if !ok {
			id = len(clients)
			clients[e.Op.Runner] = id
		}
		ops = append(ops, porcupine.Operation{ClientId: id, Input: e.Op, Output: e.Out, Call: e.Call, Return: e.Ret})
	}
	return ops
}
