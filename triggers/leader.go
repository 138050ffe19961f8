package triggers

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/go-redsync/redsync/v4"
)

// leaderEvent is a leadership transition, logged with attribute "event".
type leaderEvent string

const (
	// leaderAcquired: this Scheduler took the mutex and a new term; it
	// finishes any unfinished fan-out, then fires from now on, plus the
	// catch-up occurrence.
	leaderAcquired leaderEvent = "acquired"
	// leaderLost: an extension was refused, failed or came too late; this
	// Scheduler stopped firing at once.
	leaderLost leaderEvent = "lost"
	// leaderReleased: Run ended and the mutex was unlocked for a successor.
	leaderReleased leaderEvent = "released"
	// leaderAbandoned: Run ended without unlocking (test hook simulating a
	// crash, or the unlock failed); a successor waits for the expiry.
	leaderAbandoned leaderEvent = "abandoned"
)

// lead runs the election: a follower tries to acquire the mutex every
// renewEvery; the leader extends it every renewEvery and steps down on the
// first extension it cannot confirm in time. When ctx ends it acquires no
// more, but a leader keeps extending until loopsDone (the loops recorded
// their last batch) and then resigns, so the cursor a successor resumes
// from is up to date. A simulated crash (skipUnlock) stops at once. The
// mutex is only touched from this goroutine (redsync.Mutex is not safe for
// concurrent use).
func (s *Scheduler) lead(ctx context.Context, loopsDone <-chan struct{}) {
	if s.forceLeader {
		<-ctx.Done()
		return
	}
	m := s.rs.NewMutex(s.leaderKey,
		redsync.WithExpiry(s.ttl),
		redsync.WithTries(1), // one attempt per tick: TryLock must not spin
		redsync.WithTimeoutFactor(acquireTimeoutFactor),
		// The value names the leader and is unique per process, so resign
		// can always unlock: it deletes the mutex only if it is still ours,
		// including after an acquisition whose answer was lost. Never
		// WithSetNXOnExtend: it would re-create an expired mutex and hide
		// that leadership was lost in between.
		redsync.WithGenValueFunc(func() (string, error) { return s.owner, nil }),
		redsync.WithValue(s.owner),
	)
	rctx := context.WithoutCancel(ctx) // extensions outlive ctx until loopsDone
	failing := false                   // log a broken election once, not every tick
	timer := time.NewTimer(0)
	defer timer.Stop()
	stopping := ctx.Done()
	for {
		select {
		case <-stopping:
			if s.skipUnlock { // a crashed process extends nothing
				s.resign(rctx, m)
				return
			}
			stopping = nil // keep extending until the loops are done
			continue
		case <-loopsDone:
			s.resign(rctx, m)
			return
		case <-timer.C:
		}
		if s.leading.Load() != nil {
			s.extend(rctx, m)
		} else if ctx.Err() == nil {
			failing = s.acquire(ctx, m, failing)
		}
		timer.Reset(s.renewEvery)
	}
}

// acquire tries once to take the mutex. It reports whether the election
// is failing (Redis errors, as opposed to the mutex being taken); failing
// says whether it already was, so the error is logged once.
func (s *Scheduler) acquire(ctx context.Context, m *redsync.Mutex, failing bool) bool {
	err := m.TryLockContext(ctx)
	if err != nil {
		var taken *redsync.ErrTaken
		if errors.As(err, &taken) || errors.Is(err, redsync.ErrFailed) || ctx.Err() != nil {
			return false
		}
		level := slog.LevelWarn
		if failing {
			level = slog.LevelDebug
		}
		s.log.Log(ctx, level, "cron leader election failed", slog.Any("error", err))
		return true
	}
	// A new term fences the fan-outs of every earlier leader: without one,
	// this Scheduler does not lead.
	term, err := s.newTerm(ctx)
	if err != nil {
		level := slog.LevelWarn
		if failing {
			level = slog.LevelDebug
		}
		s.log.Log(ctx, level, "cron leadership: no term; giving the mutex back", slog.Any("error", err))
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.renewEvery)
		_, _ = m.UnlockContext(uctx)
		cancel()
		return true
	}
	until := m.Until() // if the term took too long, IsLeader is false and extend steps down
	s.leading.Store(&leadership{until: until, term: term})
	s.log.Info("cron leadership", slog.String("event", string(leaderAcquired)), slog.Time("valid_until", until),
		slog.Int64("term", term))
	for _, e := range s.entries { // look back for an occurrence lost in the handover
		select {
		case e.gained <- struct{}{}:
		default:
		}
	}
	return false
}

// extend renews the mutex; on any doubt it steps down at once.
func (s *Scheduler) extend(ctx context.Context, m *redsync.Mutex) {
	cur := *s.leading.Load()
	until := cur.until
	if !time.Now().Before(until) {
		s.stepDown("validity ran out before the extension (process paused?)", nil)
		return
	}
	// An answer after until is worthless: the mutex may have expired and
	// been taken in between.
	ectx, cancel := context.WithDeadline(ctx, until)
	ok, err := m.ExtendContext(ectx)
	cancel()
	if !ok || err != nil {
		s.stepDown("extension failed", err)
		return
	}
	s.leading.Store(&leadership{until: m.Until(), term: cur.term})
}

func (s *Scheduler) stepDown(why string, err error) {
	s.leading.Store(nil)
	attrs := []any{slog.String("event", string(leaderLost)), slog.String("reason", why)}
	if err != nil {
		attrs = append(attrs, slog.Any("error", err))
	}
	s.log.Warn("cron leadership", attrs...)
}

// resign stops firing and, unless simulating a crash, unlocks the mutex so a
// successor can acquire it at its next try instead of after the expiry. ctx
// is not cancelled by shutdown (lead passes a WithoutCancel context): with a
// cancelled one the unlock would not be sent, and the mutex would block
// everyone for its TTL.
func (s *Scheduler) resign(ctx context.Context, m *redsync.Mutex) {
	was := s.leading.Swap(nil) != nil
	if s.skipUnlock {
		if was {
			s.log.Info("cron leadership", slog.String("event", string(leaderAbandoned)))
		}
		return
	}
	uctx, cancel := context.WithTimeout(ctx, s.renewEvery)
	defer cancel()
	ok, err := m.UnlockContext(uctx)
	switch {
	case ok:
		s.log.Info("cron leadership", slog.String("event", string(leaderReleased)))
	case was:
		s.log.Warn("cron leadership", slog.String("event", string(leaderAbandoned)), slog.Any("error", err))
	}
}
