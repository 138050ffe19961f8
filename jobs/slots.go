package jobs

import (
	"context"
)

// acquire takes one slot, blocking; false when ctx ended.
func (r *Runner) acquire(ctx context.Context) bool {
	select {
	case r.slots <- struct{}{}:
		return true
	case <-ctx.Done():
		return false
	}
}

// awaitFreeSlot blocks until a slot is free, without taking it; false
// when ctx ended.
func (r *Runner) awaitFreeSlot(ctx context.Context) bool {
	if !r.acquire(ctx) {
		return false
	}
	r.release(1)
	return true
}

// freeSlots is how many slots are free now.
func (r *Runner) freeSlots() int { return cap(r.slots) - len(r.slots) }

// tryAcquire takes up to n slots without blocking.
func (r *Runner) tryAcquire(n int) int {
	got := 0
	for got < n {
		select {
		case r.slots <- struct{}{}:
			got++
		default:
			return got
		}
	}
	return got
}

func (r *Runner) release(n int) {
	for range n {
		<-r.slots
	}
}
