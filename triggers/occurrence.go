package triggers

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/wait"
	"github.com/tasklease/tasklease/jobs"
	"github.com/tasklease/tasklease/lua"
)

// cronScripts are the cron scripts (lua/cron_*.lua, each headed by its
// contract). They are made on first use, not at package init: every exec
// stage's supervisor is the runner binary started again, and its package
// inits run before main can hand over to the supervisor (building them
// took 3.4 ms of each stage's start; GODEBUG=inittrace=1).
var cronScripts = sync.OnceValue(func() struct{ term, claim, adopt, progress *redis.Script } {
	return struct{ term, claim, adopt, progress *redis.Script }{
		lua.MustScript("cron_term"), lua.MustScript("cron_claim"),
		lua.MustScript("cron_adopt"), lua.MustScript("cron_progress"),
	}
})

// tag is schedule name's hash tag: every key of one schedule lives in one
// Redis Cluster slot, so the claim (fired key + state) is one script.
func (s *Scheduler) tag(name string) string { return "{" + s.prefix + ":cron:" + name + "}" }

// firedKey is occurrence t's idempotency key (value: the claiming owner).
func (s *Scheduler) firedKey(name string, t time.Time) string {
	return s.tag(name) + ":fired:" + strconv.FormatInt(t.Unix(), 10)
}

// legacyFiredKey is the idempotency key written by releases before the
// fan-out state, without the hash tag. It is only read, so a leader of the
// previous release and one of this release never both fire an occurrence
// during a rolling deploy.
func (s *Scheduler) legacyFiredKey(name string, t time.Time) string {
	return s.prefix + ":cron:fired:" + name + ":" + strconv.FormatInt(t.Unix(), 10)
}

// stateKey is schedule name's fan-out state: a hash describing its latest
// claimed occurrence (see lua/cron_claim.lua for the fields).
func (s *Scheduler) stateKey(name string) string { return s.tag(name) + ":fanout" }

// recentKey is schedule name's recent fan-outs: a list of the states the
// last recentFanOuts claims replaced, oldest first, JSON objects of the
// state's fields.
func (s *Scheduler) recentKey(name string) string { return s.tag(name) + ":fanouts" }

// recentFanOuts bounds a schedule's recent fan-outs: an hour of a
// per-minute schedule, a month of nightly ones, about 12 KB.
const recentFanOuts = 50

// subjectsSpec fingerprints what a schedule fans out to, so a fan-out
// resumed by a runner with a different config (a deploy changed the list,
// the scope or the partitions) restarts from the beginning instead of
// applying a position that means something else; the occurrence answers
// "duplicate" for every subject it already reached.
func subjectsSpec(sc Schedule, partitions int) string {
	if sc.AllSubjects {
		return "all:" + sc.Scope + ":" + strconv.Itoa(partitions)
	}
	h := sha256.New()
	for _, subj := range sc.Subjects {
		h.Write([]byte(subj))
		h.Write([]byte{'\n'})
	}
	return "list:" + sc.Scope + ":" + strconv.Itoa(len(sc.Subjects)) + ":" + hex.EncodeToString(h.Sum(nil)[:8])
}

// stateTTL is the expiry of occurrence t's fired key and of the fan-out
// state (refreshed by every batch), and the resume bound: a fan-out that
// started longer ago than this is not resumed. max(FiredKeyTTLMin, 2 × the
// schedule's interval at t).
func stateTTL(e *entry, t time.Time) time.Duration {
	ttl := FiredKeyTTLMin
	if next := e.sched.Next(t); !next.IsZero() {
		ttl = max(ttl, 2*next.Sub(t))
	}
	return ttl
}

// newTerm opens a leadership term (lua/cron_term.lua).
func (s *Scheduler) newTerm(ctx context.Context) (int64, error) {
	return cronScripts().term.Run(ctx, s.rdb, []string{s.termKey}, TermTTL.Milliseconds()).Int64()
}

// leaderTerm returns the term under which this Scheduler surely leads now,
// or 0 when it does not lead. A forced leader (test hook) takes a term on
// first use.
func (s *Scheduler) leaderTerm(ctx context.Context) (int64, error) {
	if s.forceLeader {
		s.forcedMu.Lock()
		defer s.forcedMu.Unlock()
		if s.forcedTerm == 0 {
			t, err := s.newTerm(ctx)
			if err != nil {
				return 0, err
			}
			s.forcedTerm = t
		}
		return s.forcedTerm, nil
	}
	l := s.leading.Load()
	if l == nil || !time.Now().Before(l.until) {
		return 0, nil
	}
	return l.term, nil
}

// leadsIn reports whether this Scheduler still surely leads in term.
func (s *Scheduler) leadsIn(term int64) bool {
	if s.forceLeader {
		return true
	}
	l := s.leading.Load()
	return l != nil && l.term == term && time.Now().Before(l.until)
}

// position is a fan-out's cursor: where the next batch starts.
type position struct {
	part   int    // subjects: all — partition being scanned
	cursor uint64 // subjects: all — ZSCAN cursor in part (0: its start)
	index  int    // explicit list — index of the next subject
}

// fanOut is one runner's part of an occurrence's fan-out.
type fanOut struct {
	e       *entry
	at      time.Time // the occurrence
	term    int64
	pos     position
	resumed bool
	log     *slog.Logger
	start   time.Time

	// Requests this runner wrote, by outcome, and subjects it found
	// already reached (by an earlier part of the fan-out, or by a submit
	// whose reply was lost); batches recorded; the largest batch held;
	// retried errors.
	outcomes             map[jobs.Outcome]int
	submitted, dups      int
	batches, seq, maxLen int
	retries              int
	carry                int // requests the current page submitted in attempts not yet recorded
	// Totals of the whole occurrence, as last recorded in Redis.
	totalSubmitted, totalDups int64
}

func (s *Scheduler) newFanOut(e *entry, at time.Time, term int64, pos position, resumed bool) *fanOut {
	return &fanOut{e: e, at: at, term: term, pos: pos, resumed: resumed, start: time.Now(),
		outcomes: map[jobs.Outcome]int{},
		log: s.log.With(slog.String("schedule", e.Name), slog.String("scope", e.Scope),
			slog.Time("occurrence", at), slog.Int64("term", term))}
}

// report tells the observe hook about a decision.
func (s *Scheduler) report(e *entry, at time.Time, d Decision, f *fanOut) Decision {
	if s.observe != nil {
		fr := firing{name: e.Name, at: at, decision: d}
		if f != nil {
			fr.submitted, fr.duplicates, fr.batches, fr.maxBatch = f.submitted, f.dups, f.batches, f.maxLen
		}
		s.observe(fr)
	}
	return d
}

// claimKind is cron_claim.lua's answer.
type claimKind string

const (
	claimClaimed   claimKind = "claimed"
	claimDuplicate claimKind = "duplicate"
	claimFenced    claimKind = "fenced"
	claimBusy      claimKind = "busy"
)

// claim claims occurrence t of e under term: its fired key and a fresh
// fan-out state, in one script. arg is the holder of a duplicate, the
// newer term of a fenced claim, the unfinished occurrence of a busy one.
func (s *Scheduler) claim(ctx context.Context, e *entry, t time.Time, term int64, claimID string) (claimKind, string, error) {
	legacy, err := s.rdb.Exists(ctx, s.legacyFiredKey(e.Name, t)).Result()
	if err != nil {
		return "", "", err
	}
	if legacy > 0 {
		return claimDuplicate, "(previous release)", nil
	}
	res, err := cronScripts().claim.Run(ctx, s.rdb, []string{s.firedKey(e.Name, t), s.stateKey(e.Name), s.recentKey(e.Name)},
		s.owner, term, t.Unix(), stateTTL(e, t).Milliseconds(), claimID, e.spec, recentFanOuts).Slice()
	if err != nil {
		return "", "", err
	}
	r := replyStrings(res)
	kind, arg := claimKind(r[0]), ""
	if len(r) > 1 {
		arg = r[1]
	}
	switch kind {
	case claimClaimed, claimDuplicate, claimFenced, claimBusy:
		return kind, arg, nil
	}
	return "", "", fmt.Errorf("triggers: cron_claim answered %q", r)
}

// fire claims occurrence t of e and fans it out. A claim that fails on a
// Redis error is retried with backoff for the catch-up window (a claim
// whose reply was lost is recognised by its claim id); a schedule whose
// previous fan-out is unfinished finishes it first.
func (s *Scheduler) fire(ctx context.Context, e *entry, t time.Time) Decision {
	log := s.log.With(slog.String("schedule", e.Name), slog.String("scope", e.Scope), slog.Time("occurrence", t))
	term, err := s.leaderTerm(ctx)
	if err != nil {
		log.Error("schedule: no leadership term; occurrence not fired", slog.Any("error", err),
			slog.String("decision", string(DecisionError)))
		return s.report(e, t, DecisionError, nil)
	}
	claimID := randomHex(8)
	deadline := time.Now().Add(s.catchUp)
	backoff := s.retryMin
	for busy := 0; ; {
		if term == 0 || !s.leadsIn(term) { // never claim while unsure
			log.Info("schedule: leadership lost before the occurrence; not fired", slog.String("decision", string(DecisionNotLeader)))
			return s.report(e, t, DecisionNotLeader, nil)
		}
		kind, arg, err := s.claim(ctx, e, t, term, claimID)
		if err != nil {
			if ctx.Err() != nil || time.Now().Add(backoff).After(deadline) {
				log.Error("schedule: claiming the occurrence failed; not fired", slog.Any("error", err),
					slog.String("decision", string(DecisionError)))
				return s.report(e, t, DecisionError, nil)
			}
			log.Warn("schedule: claiming the occurrence failed; retrying", slog.Any("error", err),
				slog.Duration("retry_in", backoff))
			if !wait.Sleep(ctx, backoff) {
				return s.report(e, t, DecisionError, nil)
			}
			backoff = min(2*backoff, FanOutRetryMax)
			continue
		}
		switch kind {
		case claimClaimed:
			return s.runFanOut(ctx, s.newFanOut(e, t, term, position{}, false))
		case claimDuplicate:
			log.Debug("schedule: occurrence already fired", slog.String("holder", arg),
				slog.String("decision", string(DecisionDuplicate)))
			return s.report(e, t, DecisionDuplicate, nil)
		case claimFenced:
			log.Warn("schedule: a newer leadership term owns this schedule; not fired", slog.Int64("term", term),
				slog.String("newer_term", arg), slog.String("decision", string(DecisionFenced)))
			return s.report(e, t, DecisionFenced, nil)
		}
		// busy: the previous occurrence's fan-out is unfinished.
		if busy++; busy > 3 {
			log.Error("schedule: the previous fan-out could not be finished; occurrence not fired",
				slog.String("unfinished", arg), slog.String("decision", string(DecisionError)))
			return s.report(e, t, DecisionError, nil)
		}
		if d, found := s.resume(ctx, e); found && d != DecisionResumed {
			return d // interrupted or fenced: this occurrence is the next leader's
		}
	}
}

// resume finishes e's unfinished fan-out, if there is one, under this
// Scheduler's term: it adopts the state (from then on, writes under an
// older term are refused) and continues from its cursor. found reports
// whether there was one to resume (or a newer term owns it).
func (s *Scheduler) resume(ctx context.Context, e *entry) (d Decision, found bool) {
	term, err := s.leaderTerm(ctx)
	if err != nil || term == 0 {
		return "", false
	}
	res, err := cronScripts().adopt.Run(ctx, s.rdb, []string{s.stateKey(e.Name)},
		s.owner, term, e.spec, stateTTL(e, s.now()).Milliseconds()).Slice()
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("schedule: reading the fan-out state failed", slog.String("schedule", e.Name), slog.Any("error", err))
		}
		return DecisionError, false
	}
	r := replyStrings(res)
	switch r[0] {
	case "none", "done":
		return "", false
	case "fenced":
		s.log.Warn("schedule: a newer leadership term owns the unfinished fan-out", slog.String("schedule", e.Name),
			slog.Int64("term", term), slog.String("newer_term", r[1]), slog.String("decision", string(DecisionFenced)))
		return s.report(e, time.Time{}, DecisionFenced, nil), true
	case "abandoned":
		at := unixSeconds(r[1])
		s.log.Error("schedule: unfinished fan-out too old to resume; abandoned, the next occurrence covers its subjects",
			slog.String("schedule", e.Name), slog.String("scope", e.Scope), slog.Time("occurrence", at),
			slog.String("submitted", r[2]), slog.String("duplicates", r[3]), slog.String("decision", string(DecisionAbandoned)))
		return s.report(e, at, DecisionAbandoned, nil), false
	case "adopted":
		if len(r) < 9 {
			break
		}
		cursor, _ := strconv.ParseUint(r[3], 10, 64)
		f := s.newFanOut(e, unixSeconds(r[1]), term, position{part: atoi(r[2]), cursor: cursor, index: atoi(r[4])}, true)
		f.totalSubmitted, f.totalDups = int64(atoi(r[5])), int64(atoi(r[6]))
		attrs := []any{slog.Int("partition", f.pos.part), slog.Int("index", f.pos.index),
			slog.Int64("occurrence_submitted", f.totalSubmitted), slog.String("batches", r[7])}
		if r[8] == "1" {
			attrs = append(attrs, slog.Bool("restarted", true))
		}
		f.log.Info("schedule: resuming an unfinished fan-out", attrs...)
		return s.runFanOut(ctx, f), true
	}
	s.log.Error("schedule: unexpected fan-out state", slog.String("schedule", e.Name), slog.Any("reply", r))
	return DecisionError, false
}
