package groupcommit

// State reports a Combiner's pending items and running loops (tests).
func (c *Combiner[T]) State() (pending, loops int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending), c.inFlight
}
