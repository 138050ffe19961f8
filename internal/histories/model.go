// Package histories records what clients saw of each task key — grants
// with their fencing tokens, stage advances, finishes, including the calls
// whose reply never came — and checks the histories for linearizability
// against the sequential specification of one key's run (docs/concepts.md):
// with porcupine, partitioned per key, as etcd's robustness tests do.
package histories

import (
	"fmt"

	"github.com/anishathalye/porcupine"
)

// Kind is what an operation did to a key.
type Kind uint8

const (
	// Grant: a runner was granted the key's lease for run RunID with Token;
	// Done is the number of stages the run had completed then.
	Grant Kind = iota + 1
	// Advance: the holder of Token recorded stage Done (1-based) of RunID
	// as completed.
	Advance
	// Finish: the holder of Token ended the attempt of RunID; Ends tells
	// whether the run ended with it (done, failed, cancelled) or is to be
	// retried, and Done, when not 0, the stage it also completed.
	Finish
)

func (k Kind) String() string {
	switch k {
	case Grant:
		return "grant"
	case Advance:
		return "advance"
	case Finish:
		return "finish"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Outcome is what the client learnt of its call.
type Outcome uint8

const (
	// OK: the call took effect, and the client was told.
	OK Outcome = iota + 1
	// Refused: the call did not take effect (a fenced write refused, a
	// lease that was gone).
	Refused
	// Unknown: no reply came (a timeout, a connection cut): the call may
	// or may not have taken effect. A grant whose reply was lost has no
	// known token, and its holder never writes with it.
	Unknown
)

// Op is one client call on a key.
type Op struct {
	Key    string
	Kind   Kind
	Runner string
	RunID  string
	Token  int64 // 0 for a grant whose reply was lost
	Done   int
	Ends   bool
}

// keyState is the sequential state of one key: the highest token granted
// (above: an unanswered grant may have raised it to a token nobody knows),
// the run that holds or held it and how many of its stages are done, and
// whether that run has ended.
type keyState struct {
	max   int64
	above bool
	run   string
	done  int
	ended bool
}

// step returns the states op with outcome out can lead to from s: none when
// the step is illegal.
func step(s keyState, op Op, out Outcome) []keyState {
	if out == Refused {
		return []keyState{s} // a refusal never changes the key
	}
	var next []keyState
	if out == Unknown {
		next = append(next, s) // it may not have happened at all
	}
	switch op.Kind {
	case Grant:
		if out == Unknown {
			// Happened with a token above max that nobody saw: later
			// writes with a known token are stale.
			return append(next, keyState{max: s.max, above: true, run: s.run, done: s.done, ended: s.ended})
		}
		// Tokens only grow; a run resumes where it stood (no stage done
		// twice, none skipped); an ended run is never granted again; a new
		// run starts with nothing done.
		if op.Token <= s.max {
			return next
		}
		same := op.RunID == s.run
		if (same && (s.ended || op.Done != s.done)) || (!same && op.Done != 0) {
			return next
		}
		return append(next, keyState{max: op.Token, run: op.RunID, done: op.Done})
	case Advance:
		if !holds(s, op) || op.Done != s.done+1 {
			return next
		}
		return append(next, keyState{max: s.max, run: s.run, done: op.Done})
	case Finish:
		done := s.done
		if op.Done > 0 { // the finish also completed stage op.Done
			done = op.Done
		}
		if !holds(s, op) || done != s.done && done != s.done+1 {
			return next
		}
		return append(next, keyState{max: s.max, run: s.run, done: done, ended: op.Ends})
	}
	return next
}

// holds: op's token is the key's latest grant, of op's run, still going.
func holds(s keyState, op Op) bool {
	return !s.above && op.Token == s.max && op.RunID == s.run && !s.ended
}

// Model is the sequential specification of one key's run, nondeterministic
// where an outcome is unknown, partitioned by key.
func Model() porcupine.Model { return model.ToModel() }

var model = porcupine.NondeterministicModel{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var order []string
		for _, o := range history {
			k := o.Input.(Op).Key
			if _, ok := byKey[k]; !ok {
				order = append(order, k)
			}
			byKey[k] = append(byKey[k], o)
		}
		out := make([][]porcupine.Operation, 0, len(order))
		for _, k := range order {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() []interface{} { return []interface{}{keyState{}} },
	Step: func(state, input, output interface{}) []interface{} {
		next := step(state.(keyState), input.(Op), output.(Outcome))
		out := make([]interface{}, len(next))
		for i, s := range next {
			out[i] = s
		}
		return out
	},
	DescribeOperation: func(input, output interface{}) string {
		op, out := input.(Op), output.(Outcome)
		res := map[Outcome]string{OK: "ok", Refused: "refused", Unknown: "?"}[out]
		switch op.Kind {
		case Grant:
			return fmt.Sprintf("%s grant %s → token %d, %d done: %s", op.Runner, op.RunID, op.Token, op.Done, res)
		case Advance:
			return fmt.Sprintf("%s advance %s to stage %d with %d: %s", op.Runner, op.RunID, op.Done, op.Token, res)
		default:
			return fmt.Sprintf("%s finish %s with %d (ends %t): %s", op.Runner, op.RunID, op.Token, op.Ends, res)
		}
	},
	DescribeState: func(state interface{}) string {
		s := state.(keyState)
		return fmt.Sprintf("token %d%s, run %s, %d done, ended %t", s.max, map[bool]string{true: "+?"}[s.above], s.run, s.done, s.ended)
	},
}
