package triggers

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redsync/redsync/v4"
	goredispool "github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
	"github.com/robfig/cron/v3"

	"github.com/tasklease/tasklease/internal/keyspace"
	"github.com/tasklease/tasklease/jobs"
	"github.com/tasklease/tasklease/taskkey"
)

// Scheduler defaults and bounds.
const (
	// LeaderTTLDefault is the expiry of the cron leader mutex. A crashed
	// leader's successor fires again within about LeaderTTL + LeaderTTL/3.
	LeaderTTLDefault = 10 * time.Second
	// LeaderTTLMin bounds LeaderTTL from below: the leader must be able to
	// extend the mutex (a Redis round trip) well within LeaderTTL/3.
	LeaderTTLMin = 100 * time.Millisecond
	// LeaderRenewDivisor: the leader extends the mutex, and a follower tries
	// to acquire it, every LeaderTTL/LeaderRenewDivisor.
	LeaderRenewDivisor = 3
	// FiredKeyTTLMin is the minimum expiry of an occurrence's idempotency
	// key. The key has to outlive the catch-up window (LeaderTTL +
	// LeaderTTL/3) during which another instance might try the same
	// occurrence; an hour also absorbs gross clock skew between runners. The
	// key lives max(FiredKeyTTLMin, 2 × the schedule's interval). The same
	// duration bounds resuming: an unfinished fan-out that started longer
	// ago is abandoned, and the fan-out state expires that long after its
	// last batch.
	FiredKeyTTLMin = time.Hour
	// FanOutShutdownGrace bounds the batch in flight when Run's context
	// ends: the fan-out stops after that batch (its submit and its cursor
	// write), which may take at most this long. Stopping loses nothing —
	// the fan-out state stays in Redis and whoever leads next resumes it —
	// so the grace only saves the successor from re-sending one batch
	// (which the occurrence would answer "duplicate" anyway).
	FanOutShutdownGrace = 5 * time.Second
	// FanOutBatch is the number of subjects one fan-out batch holds: the
	// ZSCAN COUNT of a "subjects: all" page, and the slice of an explicit
	// list. A batch is one SubmitMany (one pipelined round trip) plus one
	// cursor write; memory stays about one batch whatever the subject count.
	FanOutBatch = 500
	// FanOutRetryMin and FanOutRetryMax bound the backoff between retries
	// of a batch that failed on a Redis error; a fan-out retries while it
	// still leads. FanOutRetryMin is the first wait; each retry doubles it.
	FanOutRetryMin = 100 * time.Millisecond
	// FanOutRetryMax caps the doubled wait between retries.
	FanOutRetryMax = 5 * time.Second
	// TermTTL is the expiry of the leadership term counter
	// "<prefix>:cron:term" (refreshed by every new term). Terms stay
	// monotonic without it: a term is never below Redis time in µs.
	TermTTL = 7 * 24 * time.Hour
	// acquireTimeoutFactor bounds one acquisition attempt to LeaderTTL/3
	// (redsync's default, 5% of the expiry, is a few ms for short TTLs).
	acquireTimeoutFactor = 1.0 / LeaderRenewDivisor
)

// Schedule fires a scope's requests on a cron spec.
type Schedule struct {
	// Name is unique among the schedules and part of each occurrence's
	// idempotency key: ^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$. Renaming a
	// schedule makes its occurrences new ones.
	Name string
	// Cron is five fields ("*/15 * * * *", optionally prefixed "CRON_TZ=Zone")
	// or a descriptor ("@hourly", "@every 30s"). "@every D" occurrences are at
	// whole multiples of D since the Unix epoch, D at least one second.
	Cron string
	// Scope is the job to submit; it must be registered.
	Scope string
	// Subjects are the explicit subjects to submit for, one request each.
	Subjects []string
	// AllSubjects fans out to the subjects of Scope — "subjects: all":
	// every subject requested for Scope by anything but a schedule (a
	// person, the app, the API) within the registry's retention. They are
	// streamed partition by partition (Registry.ScanSubjects), never loaded
	// at once. Exclusive with Subjects.
	AllSubjects bool
}

// SchedulerConfig configures a Scheduler.
type SchedulerConfig struct {
	// Schedules to fire. Every runner should load the same list.
	Schedules []Schedule
	// ID of this runner (e.g. the pod name), the leader identity. The
	// Scheduler's Owner is ID + "/" + a random suffix per process, as for
	// jobs.Runner. Default: the hostname.
	ID string
	// Owner, when set, is the Scheduler's Owner as is: give it the
	// jobs.Runner's Owner of the same process, so leases, the runner
	// registry and cron leadership name the process alike (ID is then
	// unused).
	Owner string
	// Prefix of the Redis keys (default "tasklease"); use the registry's.
	// Keys: "<prefix>:cron:leader" (the redsync mutex),
	// "<prefix>:cron:term" (the leadership term counter), and per schedule,
	// under its hash tag "{<prefix>:cron:<name>}":
	// "{<prefix>:cron:<name>}:fired:<unixSeconds>" (an occurrence's
	// idempotency key) and "{<prefix>:cron:<name>}:fanout" (the fan-out
	// state of its latest occurrence). See the package documentation.
	Prefix string
	// LeaderTTL is the leader mutex's expiry (default LeaderTTLDefault, at
	// least LeaderTTLMin). It is extended every LeaderTTL/3; catch-up looks
	// back LeaderTTL + LeaderTTL/3.
	LeaderTTL time.Duration
	// Location in which cron specs are evaluated (default UTC). A spec's own
	// CRON_TZ= prefix wins.
	Location *time.Location
	// Logger (default slog.Default()).
	Logger *slog.Logger
}

// Decision is what a Scheduler did with one due occurrence.
type Decision string

// Decisions, logged with attribute "decision" and reported to the
// observe test hook.
const (
	// DecisionFired: this runner claimed the occurrence (its fired key and
	// fan-out state, in one step) and submitted one request per subject to
	// the end of the fan-out.
	DecisionFired Decision = "fired"
	// DecisionResumed: this runner took over an unfinished fan-out (its own
	// after an error, or a previous leader's after a crash or handover) and
	// finished it from the saved cursor; subjects it had already reached
	// answered "duplicate".
	DecisionResumed Decision = "resumed"
	// DecisionInterrupted: the fan-out (fired or resumed) stopped before
	// its end — shutdown, or leadership lost — with its cursor saved in
	// Redis; whoever leads next resumes it.
	DecisionInterrupted Decision = "interrupted"
	// DecisionDuplicate: the occurrence (or a later one) was claimed
	// already — by another instance, or an earlier leader; nothing was
	// submitted.
	DecisionDuplicate Decision = "duplicate"
	// DecisionFenced: a newer leadership term owns the schedule's fan-out:
	// this runner is a deposed leader; it submitted nothing more and moved
	// no cursor.
	DecisionFenced Decision = "fenced"
	// DecisionAbandoned: an unfinished fan-out was older than the resume
	// bound (the occurrence's fired-key TTL since it started); it was
	// marked done without finishing — the next occurrence covers its
	// subjects.
	DecisionAbandoned Decision = "abandoned"
	// DecisionNotLeader: leadership was lost (or could not be confirmed)
	// before the occurrence was claimed; nothing was submitted.
	DecisionNotLeader Decision = "not_leader"
	// DecisionError: Redis kept failing while claiming the occurrence (it
	// is retried for the catch-up window; the occurrence is then not
	// retried), the fan-out state expired under a running fan-out, or its
	// batches kept failing for as long as a fan-out may be resumed (the
	// state stays unfinished: a later resume continues it or, once too
	// old, abandons it).
	DecisionError Decision = "error"
)

// Scheduler fires cron schedules through a jobs.Registry. Every runner runs
// one; only the elected leader fires, each occurrence is claimed with an
// idempotency key first, and its fan-out keeps a cursor in Redis, fenced by
// the leadership term, that whoever leads next finishes (see the package
// documentation).
type Scheduler struct {
	rdb        redis.UniversalClient
	reg        *jobs.Registry
	entries    []*entry
	owner      string
	prefix     string
	leaderKey  string
	termKey    string
	ttl        time.Duration
	renewEvery time.Duration
	catchUp    time.Duration
	loc        *time.Location
	log        *slog.Logger
	rs         *redsync.Redsync
	leading    atomic.Pointer[leadership] // nil = follower
	started    atomic.Bool

	forcedMu   sync.Mutex
	forcedTerm int64 // forceLeader's term, taken on first use

	// Test hooks, set before Run by tests in this package.
	now         func() time.Time // occurrence clock (default time.Now)
	skipUnlock  bool             // simulate a crash: exit without releasing the mutex
	forceLeader bool             // believe to lead, without an election
	observe     func(firing)     // called after each decision
	// afterSubmit is called after a batch was submitted and before its
	// cursor write; returning false simulates a crash right there (the
	// fan-out ends without writing anything more).
	afterSubmit func(batchInfo) bool
	batchSize   int           // subjects per batch (default FanOutBatch)
	retryMin    time.Duration // first retry backoff (default FanOutRetryMin)
}

// leadership is one term of this Scheduler's leadership.
type leadership struct {
	until time.Time // valid before (redsync's validity, drift deducted)
	term  int64     // the term number (cron_term.lua), fencing fan-out writes
}

// entry is one validated schedule.
type entry struct {
	Schedule
	sched  cron.Schedule
	spec   string        // fingerprint of scope and subjects (fan-out state "spec")
	gained chan struct{} // leadership was (re)acquired: look back for catch-up and resume
}

// firing reports one decision to the observe hook.
type firing struct {
	name       string
	at         time.Time // the occurrence
	decision   Decision
	submitted  int // requests written by this runner's part of the fan-out
	duplicates int // subjects this runner found already reached
	batches    int // batches this runner recorded
	maxBatch   int // the most subjects one batch held
}

// batchInfo describes one batch to the afterSubmit test hook.
type batchInfo struct {
	name  string
	at    time.Time
	n     int // subjects in the batch
	seq   int // 1 for the first batch of this runner's part of the fan-out
	owner string
}

var nameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`) })

var cronParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// NewScheduler validates cfg against reg's jobs and returns a Scheduler.
// Every problem is reported (errors.Join); each wraps jobs.ErrConfig, and
// jobs.ErrUnknownScope or taskkey.ErrInvalid where they apply.
func NewScheduler(rdb redis.UniversalClient, reg *jobs.Registry, cfg SchedulerConfig) (*Scheduler, error) {
	if rdb == nil || reg == nil {
		return nil, fmt.Errorf("%w: scheduler needs a redis client and a registry", jobs.ErrConfig)
	}
	var errs []error
	bad := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{jobs.ErrConfig}, args...)...))
	}
	if cfg.ID == "" {
		h, err := os.Hostname()
		if err != nil || h == "" {
			h = "runner"
		}
		cfg.ID = h
	}
	if cfg.Owner == "" {
		if strings.ContainsAny(cfg.ID, " |") || len(cfg.ID) > 100 {
			bad("scheduler id %q: no spaces or '|', at most 100 bytes", cfg.ID)
		}
	} else if strings.ContainsAny(cfg.Owner, " |") || len(cfg.Owner) > 128 {
		bad("scheduler owner %q: no spaces or '|', at most 128 bytes", cfg.Owner)
	}
	ks, err := keyspace.New(cfg.Prefix, 0)
	if err != nil {
		bad("%w", err)
	}
	if cfg.LeaderTTL == 0 {
		cfg.LeaderTTL = LeaderTTLDefault
	}
	renew := cfg.LeaderTTL / LeaderRenewDivisor
	// As client-go's leaderelection: TTL > renew interval > 0, and a floor
	// that leaves room for a Redis round trip.
	if cfg.LeaderTTL < LeaderTTLMin || renew <= 0 || renew >= cfg.LeaderTTL {
		bad("leader TTL %s must be at least %s", cfg.LeaderTTL, LeaderTTLMin)
	}
	if cfg.Location == nil {
		cfg.Location = time.UTC
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}

	s := &Scheduler{
		rdb: rdb, reg: reg, ttl: cfg.LeaderTTL, renewEvery: renew,
		catchUp: cfg.LeaderTTL + renew, loc: cfg.Location, now: time.Now,
	}
	seen := map[string]bool{}
	for i, sc := range cfg.Schedules {
		label := fmt.Sprintf("schedule %q", sc.Name)
		if sc.Name == "" {
			label = fmt.Sprintf("schedule #%d", i+1)
		}
		switch {
		case !nameRE().MatchString(sc.Name):
			bad("%s: name must match %s", label, nameRE())
		case seen[sc.Name]:
			bad("%s: duplicate name", label)
		}
		seen[sc.Name] = true
		sched, err := ParseCron(sc.Cron)
		if err != nil {
			bad("%s: cron %q: %v", label, sc.Cron, err)
		} else if sched.Next(time.Now().In(cfg.Location)).IsZero() {
			bad("%s: cron %q never fires", label, sc.Cron)
		}
		if _, ok := reg.Job(sc.Scope); !ok {
			bad("%s: %w: %q", label, jobs.ErrUnknownScope, sc.Scope)
		}
		switch {
		case sc.AllSubjects && len(sc.Subjects) > 0:
			bad("%s: subjects: give a list or all, not both", label)
		case !sc.AllSubjects && len(sc.Subjects) == 0:
			bad("%s: no subjects (give a list or all)", label)
		}
		subjects := map[string]bool{}
		for _, subj := range sc.Subjects {
			if err := taskkey.ValidateSubject(subj); err != nil {
				bad("%s: %w", label, err)
			} else if subjects[subj] {
				bad("%s: duplicate subject %q", label, subj)
			}
			subjects[subj] = true
		}
		sc.Subjects = slices.Clone(sc.Subjects)
		s.entries = append(s.entries, &entry{Schedule: sc, sched: sched, spec: subjectsSpec(sc, reg.Partitions()),
			gained: make(chan struct{}, 1)})
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	s.prefix = ks.Prefix()
	s.leaderKey = s.prefix + ":cron:leader"
	s.termKey = s.prefix + ":cron:term"
	s.batchSize, s.retryMin = FanOutBatch, FanOutRetryMin
	s.owner = cfg.Owner
	if s.owner == "" {
		s.owner = cfg.ID + "/" + randomHex(3)
	}
	s.log = cfg.Logger.With(slog.String("component", "scheduler"), slog.String("owner", s.owner))
	s.rs = redsync.New(goredispool.NewPool(rdb))
	return s, nil
}

// ParseCron parses a schedule's cron spec (five fields or a descriptor such
// as "@every 30s" or "@hourly"); "@every D" becomes epoch-anchored so every
// runner computes the same occurrences. Config validation uses it too, so a
// config that validates is one the scheduler runs. robfig/cron panics on
// some malformed "TZ=" prefixes; that is reported as an error.
func ParseCron(spec string) (sched cron.Schedule, err error) {
	defer func() {
		if r := recover(); r != nil {
			sched, err = nil, fmt.Errorf("malformed spec")
		}
	}()
	sched, err = cronParser.Parse(spec)
	if err != nil {
		return nil, err
	}
	if every, ok := sched.(cron.ConstantDelaySchedule); ok {
		// robfig/cron silently rounds "@every 1500ms" down and "@every 0s"
		// up; an operator should hear about it instead.
		_, arg, _ := strings.Cut(spec, "@every")
		if d, err := time.ParseDuration(strings.TrimSpace(arg)); err != nil || d < time.Second || d%time.Second != 0 {
			return nil, fmt.Errorf("@every needs a whole number of seconds, at least 1s")
		}
		return anchoredEvery{secs: int64(every.Delay / time.Second)}, nil
	}
	return sched, nil
}

// anchoredEvery fires at whole multiples of secs since the Unix epoch, so
// every runner computes the same occurrences (robfig's ConstantDelaySchedule
// counts from whenever Next is first called).
type anchoredEvery struct{ secs int64 }

// Next returns the first multiple of secs strictly after t.
func (a anchoredEvery) Next(t time.Time) time.Time {
	u := t.Unix() // floor for t after 1970
	return time.Unix((u/a.secs+1)*a.secs, 0).In(t.Location())
}

// latestDue returns the latest occurrence T with from < T <= now.
func latestDue(sched cron.Schedule, from, now time.Time) (time.Time, bool) {
	var last time.Time
	found := false
	for t := sched.Next(from); !t.IsZero() && !t.After(now); t = sched.Next(t) {
		last, found = t, true
	}
	return last, found
}

// Owner returns this Scheduler's identity: the leader mutex value while it
// leads, the value of the fired keys it sets, and the owner recorded in the
// fan-out states it claims or resumes.
func (s *Scheduler) Owner() string { return s.owner }

// IsLeader reports whether this Scheduler currently, and surely, leads: it
// holds the mutex and its validity (as confirmed by the last acquisition or
// extension, minus redsync's drift allowance) has not run out.
func (s *Scheduler) IsLeader() bool {
	if s.forceLeader {
		return true
	}
	l := s.leading.Load()
	return l != nil && time.Now().Before(l.until)
}

// Leader returns the Owner of the current leader as stored in Redis, or ""
// when nobody leads.
func (s *Scheduler) Leader(ctx context.Context) (string, error) {
	v, err := s.rdb.Get(ctx, s.leaderKey).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	return v, err
}

// Run elects a leader and fires the schedules until ctx ends. When ctx
// ends, a fan-out in progress stops after its current batch (at most
// FanOutShutdownGrace), then leadership is released (Unlock) so a successor
// takes over at once and resumes any unfinished fan-out from its cursor.
// It returns nil when ctx ends; Run may be called once.
func (s *Scheduler) Run(ctx context.Context) error {
	if !s.started.CompareAndSwap(false, true) {
		return errors.New("triggers: Scheduler.Run called twice")
	}
	s.log.Info("scheduler started", slog.Int("schedules", len(s.entries)),
		slog.Duration("leader_ttl", s.ttl), slog.Bool("force_leader", s.forceLeader))
	loopsDone := make(chan struct{})
	var leader, loops sync.WaitGroup
	leader.Go(func() { s.lead(ctx, loopsDone) })
	for _, e := range s.entries {
		loops.Go(func() { s.loop(ctx, e) })
	}
	loops.Wait()
	close(loopsDone) // the last batches are recorded: resign now
	leader.Wait()
	s.log.Info("scheduler stopped")
	return nil
}

// loop waits for e's occurrences and, while leading, first finishes e's
// unfinished fan-out (if any), then fires the due occurrence.
func (s *Scheduler) loop(ctx context.Context, e *entry) {
	var lastFired time.Time // latest occurrence this loop tried to claim
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for ctx.Err() == nil {
		now := s.now().In(s.loc)
		if s.IsLeader() {
			// An interrupted or fenced resume waits for the next wake-up
			// (leadership gained again, or the next occurrence).
			d, found := s.resume(ctx, e)
			if found && d == DecisionResumed {
				continue // finished; the next occurrence may be due meanwhile
			}
			if !found {
				if t, ok := s.due(e, lastFired, now); ok {
					lastFired = t
					s.fire(ctx, e, t)
					continue // the fan-out took time: look again
				}
			}
		}
		next := e.sched.Next(now)
		if next.IsZero() {
			s.log.Info("schedule has no further occurrences", slog.String("schedule", e.Name))
			<-ctx.Done()
			return
		}
		timer.Reset(next.Sub(now))
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-e.gained:
		}
	}
}

// due returns the occurrence a leader fires at now: the latest one that is
// due (at or before now), inside the catch-up window, and after lastFired.
func (s *Scheduler) due(e *entry, lastFired, now time.Time) (time.Time, bool) {
	from := now.Add(-s.catchUp)
	if lastFired.After(from) {
		from = lastFired
	}
	return latestDue(e.sched, from, now)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
