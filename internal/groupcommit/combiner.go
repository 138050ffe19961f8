package groupcommit

import (
	"context"
	"sync"
)

// Combiner hands items added concurrently to one flush function in
// batches: an item added while no flush runs is flushed at once; items
// added while MaxInFlight flushes run wait for the next one. Client is a
// Combiner of command groups; the engine also combines submits of one
// partition into one script call.
type Combiner[T any] struct {
	flush       func([]T) // completes every item it is given
	maxInFlight int
	maxBatch    int

	mu       sync.Mutex
	pending  []*waiting[T]
	inFlight int
}

type waiting[T any] struct {
	item T
	done chan struct{}
}

// NewCombiner returns a Combiner calling flush with up to maxBatch items,
// at most maxInFlight flushes at once (both at least 1).
func NewCombiner[T any](maxInFlight, maxBatch int, flush func([]T)) *Combiner[T] {
	return &Combiner[T]{flush: flush, maxInFlight: max(1, maxInFlight), maxBatch: max(1, maxBatch)}
}

// Add queues item and returns once a flush has completed it, or when ctx
// ends (the item may still be flushed). An item whose ctx has already ended
// is not queued.
func (c *Combiner[T]) Add(ctx context.Context, item T) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	w := &waiting[T]{item: item, done: make(chan struct{})}
	c.mu.Lock()
	c.pending = append(c.pending, w)
	if c.inFlight < c.maxInFlight {
		c.inFlight++
		go c.loop()
	}
	c.mu.Unlock()
	select {
	case <-w.done:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// loop flushes pending items until there are none, then exits.
func (c *Combiner[T]) loop() {
	for {
		c.mu.Lock()
		if len(c.pending) == 0 {
			c.inFlight--
			c.mu.Unlock()
			return
		}
		n := min(len(c.pending), c.maxBatch)
		batch := make([]*waiting[T], n)
		copy(batch, c.pending)
		clear(c.pending[:n])
		c.pending = c.pending[n:]
		c.mu.Unlock()
		items := make([]T, n)
		for i, w := range batch {
			items[i] = w.item
		}
		c.flush(items)
		for _, w := range batch {
			close(w.done)
		}
	}
}
