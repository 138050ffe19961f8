package histories

import (
	"bytes"
	"math"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// TestLogRoundTrip: what a runner wrote (a grant, an advance answered, a
// finish sent but never answered, a torn last line) reads back as the
// operations porcupine checks; the unanswered finish is Unknown, open to
// the end, and may or may not have ended the run.
func TestLogRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	l := NewLog(&buf)
	t0 := time.Unix(1000, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	g := grant("a/1", "r1", 10, 0)
	l.Returned(g, OK, ms(0), ms(1))
	adv := advance("a/1", "r1", 10, 1)
	l.Sent(adv, ms(2))
	l.Returned(adv, OK, ms(2), ms(3))
	fin := finish("a/1", "r1", 10, false)
	fin.Done = 2
	l.Sent(fin, ms(4))
	buf.WriteString(`{"key":"u1|sync","kind":"adv`) // killed while writing

	es, err := ReadLog(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if len(es) != 3 {
		t.Fatalf("%d entries, want 3: %+v", len(es), es)
	}
	if es[0].Op != g || es[0].Out != OK || es[0].Call != ms(0).UnixNano() || es[0].Ret != ms(1).UnixNano() {
		t.Errorf("grant = %+v", es[0])
	}
	if es[1].Op != adv || es[1].Out != OK || es[1].Ret != ms(3).UnixNano() {
		t.Errorf("advance = %+v (its pending line must be replaced by its answer)", es[1])
	}
	if es[2].Op != fin || es[2].Out != Unknown || es[2].Ret != math.MaxInt64 {
		t.Errorf("unanswered finish = %+v, want %+v, Unknown, open", es[2], fin)
	}

	// Whether or not that finish took effect, r1 may go on where it was or
	// where the finish left it, and a new run may start.
	for _, next := range []Op{grant("b/1", "r1", 11, 1), grant("b/1", "r1", 11, 2), grant("b/1", "r2", 11, 0)} {
		ops := append(Operations(es), porcupine.Operation{ClientId: 9, Input: next, Output: OK,
			Call: ms(10).UnixNano(), Return: ms(11).UnixNano()})
		if res, err := Check(ops, 10*time.Second, ""); err != nil || res.Verdict != porcupine.Ok {
			t.Errorf("then %+v: %v, %v; want Ok", next, res, err)
		}
	}
	// An answered finish that did not end the run: granting a new run of
	// the key before r1 ended is not.
	es[2].Out, es[2].Ret = OK, ms(5).UnixNano()
	ops := append(Operations(es), porcupine.Operation{Input: grant("b/1", "r1", 11, 1), Output: OK,
		Call: ms(10).UnixNano(), Return: ms(11).UnixNano()})
	if res, _ := Check(ops, 10*time.Second, ""); res.Verdict != porcupine.Illegal {
		t.Errorf("r1 resumed with 1 stage done after its finish completed stage 2: %v, want Illegal", res)
	}
}

// TestReadLogRejectsCorruptLines: a bad line before the last is an error,
// not something to skip.
func TestReadLogRejectsCorruptLines(t *testing.T) {
	in := "{not json}\n" + `{"key":"k","kind":"grant","runner":"a","runId":"r","token":1,"out":"ok","call":1,"ret":2}` + "\n"
	if _, err := ReadLog(bytes.NewBufferString(in)); err == nil {
		t.Fatal("a corrupt line in the middle was accepted")
	}
}
