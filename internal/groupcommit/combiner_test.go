package groupcommit_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tasklease/tasklease/internal/groupcommit"
)

// heldFlushes is a flush function whose calls report their batch on
// started and return only when the test ends that very flush.
type heldFlushes struct {
	started chan *held
}

// held is one flush in progress: its batch, and end to let it return.
type held struct {
	items []string
	end   chan struct{}
}

func (f *held) String() string { return fmt.Sprint(f.items) }

func newHeldFlushes() *heldFlushes { return &heldFlushes{started: make(chan *held, 16)} }

func (h *heldFlushes) flush(items []string) {
	f := &held{items: items, end: make(chan struct{})}
	h.started <- f
	<-f.end
}

// next waits for the next flush to start.
func (h *heldFlushes) next(t *testing.T) *held {
	t.Helper()
	select {
	case f := <-h.started:
		return f
	case <-time.After(10 * time.Second):
		t.Fatal("no flush started")
		return nil
	}
}

// none checks that no flush has started.
func (h *heldFlushes) none(t *testing.T, why string) {
	t.Helper()
	select {
	case f := <-h.started:
		t.Fatalf("flush %v started: %s", f, why)
	default:
	}
}

// add adds item from a goroutine and returns a channel closed when Add
// returned.
func add(c *groupcommit.Combiner[string], item string) chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = c.Add(context.Background(), item)
	}()
	return done
}

// addAll adds each item from a goroutine of its own (see add).
func addAll(t *testing.T, c *groupcommit.Combiner[string], items ...string) []chan struct{} {
	t.Helper()
	var out []chan struct{}
	for _, it := range items {
		out = append(out, add(c, it))
	}
	return out
}

// A balanced Combiner starts a flush beside a running one only when it
// carries at least as many items; an unbalanced one starts it with
// whatever is pending. Which of the two happened shows in the batches.
func TestBalancedFlushWaitsForAnEvenShare(t *testing.T) {
	for _, balanced := range []bool{true, false} {
		t.Run(fmt.Sprintf("balanced=%v", balanced), func(t *testing.T) {
			h := newHeldFlushes()
			c := groupcommit.NewCombiner(groupcommit.CombinerConfig{MaxInFlight: 2, MaxBatch: 100, Balanced: balanced}, h.flush)

			// Idle: A is flushed at once. B is as many items as the running
			// flush (one): it goes beside it.
			addAll(t, c, "A")
			a := h.next(t)
			if a.String() != "[A]" {
				t.Fatalf("first flush %v, want [A]", a)
			}
			addAll(t, c, "B")
			b := h.next(t)
			if b.String() != "[B]" {
				t.Fatalf("second flush %v, want [B] beside [A]", b)
			}
			// Both slots busy: C, D, E wait, and go together when [A] ends.
			cde := addAll(t, c, "C", "D", "E")
			waitQueued(t, c, 3)
			close(a.end)
			three := h.next(t)
			if len(three.items) != 3 {
				t.Fatalf("after [A]: flush %v, want C, D and E together", three)
			}
			// F is pending while [B] and [C D E] run; [B] ends.
			f := addAll(t, c, "F")
			waitQueued(t, c, 1)
			close(b.end)
			if balanced {
				// One item beside three: F waits for [C D E] to end.
				waitLoops(t, c, 1)
				h.none(t, "one item beside a running flush of three")
				close(three.end)
				for _, d := range cde {
					<-d
				}
				if last := h.next(t); last.String() != "[F]" {
					t.Fatalf("after [C D E]: flush %v, want [F]", last)
				} else {
					close(last.end)
				}
			} else {
				last := h.next(t)
				if last.String() != "[F]" {
					t.Fatalf("after [B]: flush %v, want [F] beside [C D E]", last)
				}
				close(last.end)
				close(three.end)
			}
			<-f[0]
		})
	}
}

// waitQueued waits until n items are pending.
func waitQueued(t *testing.T, c *groupcommit.Combiner[string], n int) {
	t.Helper()
	waitFor(t, 10*time.Second, fmt.Sprintf("%d pending", n), func() bool { p, _ := c.State(); return p == n })
}

// waitLoops waits until n flushing loops run.
func waitLoops(t *testing.T, c *groupcommit.Combiner[string], n int) {
	t.Helper()
	waitFor(t, 10*time.Second, fmt.Sprintf("%d loops", n), func() bool { _, l := c.State(); return l == n })
}

// Under many concurrent Adds every item is flushed exactly once, whether
// or not the Combiner is balanced: a loop leaves pending items only to
// another loop.
func TestCombinerFlushesEveryItemOnce(t *testing.T) {
	for _, balanced := range []bool{true, false} {
		t.Run(fmt.Sprintf("balanced=%v", balanced), func(t *testing.T) {
			var mu sync.Mutex
			seen := map[string]int{}
			c := groupcommit.NewCombiner(groupcommit.CombinerConfig{MaxInFlight: 2, MaxBatch: 7, Balanced: balanced},
				func(items []string) {
					mu.Lock()
					defer mu.Unlock()
					for _, it := range items {
						seen[it]++
					}
				})
			const workers, each = 50, 200
			var wg sync.WaitGroup
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range each {
						if err := c.Add(context.Background(), fmt.Sprintf("%d/%d", w, i)); err != nil {
							t.Error(err)
							return
						}
					}
				}()
			}
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				t.Fatal("Adds did not all return: an item was left pending")
			}
			if len(seen) != workers*each {
				t.Fatalf("%d distinct items flushed, want %d", len(seen), workers*each)
			}
			for it, n := range seen {
				if n != 1 {
					t.Fatalf("item %s flushed %d times", it, n)
				}
			}
			waitFor(t, 10*time.Second, "no pending items and no loop", func() bool { p, l := c.State(); return p == 0 && l == 0 })
		})
	}
}
