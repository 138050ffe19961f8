package histories

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// at builds an operation called at call and answered at ret (ms); ret < 0:
// never answered.
func at(op Op, out Outcome, call, ret int64) porcupine.Operation {
	if ret < 0 {
		ret = 1 << 62
	}
	return porcupine.Operation{Input: op, Output: out, Call: call, Return: ret}
}

func grant(runner, run string, token int64, done int) Op {
	return Op{Key: "u1|sync", Kind: Grant, Runner: runner, RunID: run, Token: token, Done: done}
}

func advance(runner, run string, token int64, stage int) Op {
	return Op{Key: "u1|sync", Kind: Advance, Runner: runner, RunID: run, Token: token, Done: stage}
}

func finish(runner, run string, token int64, ends bool) Op {
	return Op{Key: "u1|sync", Kind: Finish, Runner: runner, RunID: run, Token: token, Ends: ends}
}

func TestModel(t *testing.T) {
	cases := []struct {
		name string
		ops  []porcupine.Operation
		want porcupine.CheckResult
	}{
		{"a run, crashed and resumed on another runner", []porcupine.Operation{
			at(grant("a", "r1", 10, 0), OK, 0, 1),
			at(advance("a", "r1", 10, 1), OK, 2, 3),
			at(grant("b", "r1", 20, 1), OK, 10, 11), // a's lease expired
			at(advance("a", "r1", 10, 2), Refused, 12, 13),
			at(advance("b", "r1", 20, 2), OK, 14, 15),
			at(finish("b", "r1", 20, true), OK, 16, 17),
			at(grant("b", "r2", 30, 0), OK, 18, 19),
		}, porcupine.Ok},
		{"a double grant: two holders at once", []porcupine.Operation{
			at(grant("a", "r1", 10, 0), OK, 0, 1),
			at(grant("b", "r1", 11, 0), OK, 2, 3),
			at(advance("a", "r1", 10, 1), OK, 4, 5), // a still wrote
		}, porcupine.Illegal},
		{"a lower token granted after a higher one", []porcupine.Operation{
			at(grant("a", "r1", 20, 0), OK, 0, 1),
			at(finish("a", "r1", 20, true), OK, 2, 3),
			at(grant("b", "r2", 15, 0), OK, 4, 5),
		}, porcupine.Illegal},
		{"a stage done twice", []porcupine.Operation{
			at(grant("a", "r1", 10, 0), OK, 0, 1),
			at(advance("a", "r1", 10, 1), OK, 2, 3),
			at(grant("b", "r1", 20, 0), OK, 10, 11), // recovery restarted a done stage
		}, porcupine.Illegal},
		{"a stage recorded done twice by its holder", []porcupine.Operation{
			at(grant("a", "r1", 10, 0), OK, 0, 1),
			at(advance("a", "r1", 10, 1), OK, 2, 3),
			at(advance("a", "r1", 10, 1), OK, 4, 5),
		}, porcupine.Illegal},
		{"an ended run granted again", []porcupine.Operation{
			at(grant("a", "r1", 10, 0), OK, 0, 1),
			at(finish("a", "r1", 10, true), OK, 2, 3),
			at(grant("b", "r1", 20, 0), OK, 4, 5),
		}, porcupine.Illegal},
		{"a finish whose reply was lost, then a retry of it refused", []porcupine.Operation{
			at(grant("a", "r1", 10, 0), OK, 0, 1),
			at(finish("a", "r1", 10, true), Unknown, 2, -1),
			at(finish("a", "r1", 10, true), Refused, 5, 6),
			at(grant("b", "r2", 30, 0), OK, 7, 8),
		}, porcupine.Ok},
		{"a grant whose reply was lost makes the old token stale", []porcupine.Operation{
			at(grant("a", "r1", 10, 0), OK, 0, 1),
			at(grant("b", "r1", 0, 0), Unknown, 2, -1),
			at(advance("a", "r1", 10, 1), Refused, 3, 4),
			at(grant("c", "r1", 40, 0), OK, 50, 51),
		}, porcupine.Ok},
		{"concurrent calls may be ordered either way", []porcupine.Operation{
			at(grant("a", "r1", 10, 0), OK, 0, 10),
			at(advance("a", "r1", 10, 1), OK, 5, 6), // overlaps its own grant's reply
		}, porcupine.Ok},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res, err := Check(c.ops, 10*time.Second, t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			if res.Verdict != c.want {
				t.Fatalf("porcupine says %s, want %s (%s)", res.Verdict, c.want, res)
			}
			if c.want == porcupine.Illegal {
				if fi, err := os.Stat(res.HTML); err != nil || fi.Size() == 0 {
					t.Errorf("no visualisation at %q: %v", res.HTML, err)
				}
			}
		})
	}
}

// Histories of several keys are checked apart: a violation on one key is
// found among legal histories of others, and the Recorder times calls.
func TestRecorderPartitionsByKey(t *testing.T) {
	r := NewRecorder()
	now := time.Now()
	for i, k := range []string{"a|s", "b|s", "c|s"} {
		tok := int64(100 * (i + 1))
		r.Add(Op{Key: k, Kind: Grant, Runner: "r", RunID: "x", Token: tok}, OK, now, now.Add(time.Millisecond))
		r.Add(Op{Key: k, Kind: Finish, Runner: "r", RunID: "x", Token: tok, Ends: true}, OK, now.Add(2*time.Millisecond), now.Add(3*time.Millisecond))
	}
	res, err := r.Check(10*time.Second, filepath.Join(t.TempDir(), "viz"))
	if err != nil || res.Verdict != porcupine.Ok || res.Keys != 3 {
		t.Fatalf("%s, %v", res, err)
	}
	r.Add(Op{Key: "b|s", Kind: Grant, Runner: "q", RunID: "y", Token: 150}, OK, now.Add(4*time.Millisecond), now.Add(5*time.Millisecond))
	if res, _ = r.Check(10*time.Second, ""); res.Verdict != porcupine.Illegal {
		t.Fatalf("a lower token on b|s: %s", res)
	}
}
