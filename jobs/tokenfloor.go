package jobs

import (
	"strconv"
	"strings"
)

// A grant's fencing token is max(the key's last token + 1, Redis TIME in
// µs). When Redis loses the key's record (a restart without persistence, a
// failover to a replica that had not received it, a flush) and its clock
// also lags the clock of the primary that issued the last token by more
// than the time since — a failover to a replica whose clock is behind —
// TIME alone would give a token below one already issued, and a fencing
// downstream would take the old holder's writes over the new one's. So
// every call that may grant a runner a lease carries a floor the scripts
// grant above (lua/lib/base.lua floored): the higher of
//   - the highest token the runner has seen (granted to it, named as
//     another holder's in a busy reply, or reported by any runner on its
//     presence beat: runner_beat.lua keeps the fleet's highest, and writes
//     it back on the first beat after Redis lost it), and
//   - the runner's own clock in µs: a token issued by a primary whose
//     clock was right is below it, even one issued to another runner a
//     moment before the loss that no beat has reported yet.
// Either alone covers most losses; both fail only when Redis's clock and
// the runner's lag together, for a token issued to another runner less
// than two presence intervals before the loss (docs/correctness.md).

// sawToken raises the runner's token floor to t.
func (r *Runner) sawToken(t int64) {
	for {
		cur := r.tokensSeen.Load()
		if t <= cur || r.tokensSeen.CompareAndSwap(cur, t) {
			return
		}
	}
}

// sawHolder raises the floor to the token of a lease value "<token>|<owner>"
// (a busy claim's holder).
func (r *Runner) sawHolder(holder string) {
	tok, _, ok := strings.Cut(holder, "|")
	if !ok {
		return
	}
	if t, err := strconv.ParseInt(tok, 10, 64); err == nil {
		r.sawToken(t)
	}
}

// tokenFloor is the highest fencing token this runner has seen (0: none
// yet), which its presence beat reports to the fleet.
func (r *Runner) tokenFloor() int64 { return r.tokensSeen.Load() }

// grantFloor is the floor every call that may grant this runner a lease
// sends: its tokenFloor, or its clock in µs when later. Cost: a clock read
// per call.
func (r *Runner) grantFloor() int64 {
	if timeTokensOnly {
		return 0
	}
	return max(r.tokensSeen.Load(), r.wallClock().UnixMicro())
}
