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
	"strconv"
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
	// key. The key only has to outlive the catch-up window (LeaderTTL +
	// LeaderTTL/3) during which another instance might try the same
	// occurrence; an hour also absorbs gross clock skew between runners. The
	// key lives max(FiredKeyTTLMin, 2 × the schedule's interval).
	FiredKeyTTLMin = time.Hour
	// FanOutShutdownGrace is how long a claimed occurrence's fan-out may go
	// on after Run's context ended, so that shutdown does not leave an
	// occurrence half fired.
	FanOutShutdownGrace = 5 * time.Second
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
	// AllSubjects fans out to every subject ever submitted for Scope
	// (Registry.Subjects, read at fire time) — "subjects: all". Exclusive
	// with Subjects.
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
	// Prefix of the Redis keys (default "tasklease"); use the registry's.
	// Keys: "<prefix>:cron:leader" (the redsync mutex) and
	// "<prefix>:cron:fired:<name>:<unixSeconds>" (idempotency keys).
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

// Decisions, logged with attribute "decision".
const (
	// DecisionFired: this runner set the occurrence's fired key and
	// submitted one request per subject.
	DecisionFired Decision = "fired"
	// DecisionDuplicate: the fired key existed — another instance (or an
	// earlier leader) fired the occurrence; nothing was submitted.
	DecisionDuplicate Decision = "duplicate"
	// DecisionNotLeader: leadership was lost (or could not be confirmed)
	// before the occurrence was claimed; nothing was submitted.
	DecisionNotLeader Decision = "not_leader"
	// DecisionError: Redis failed before the occurrence was claimed (or
	// "all" subjects could not be read); nothing was submitted and the
	// occurrence is not retried.
	DecisionError Decision = "error"
)

// Scheduler fires cron schedules through a jobs.Registry. Every runner runs
// one; only the elected leader fires, and each occurrence is claimed with an
// idempotency key first (see the package documentation).
type Scheduler struct {
	rdb        redis.UniversalClient
	reg        *jobs.Registry
	entries    []*entry
	owner      string
	prefix     string
	leaderKey  string
	ttl        time.Duration
	renewEvery time.Duration
	catchUp    time.Duration
	loc        *time.Location
	log        *slog.Logger
	rs         *redsync.Redsync
	until      atomic.Pointer[time.Time] // leadership valid before; nil = follower
	started    atomic.Bool

	// Test hooks, set before Run by tests in this package.
	now         func() time.Time // occurrence clock (default time.Now)
	skipUnlock  bool             // simulate a crash: exit without releasing the mutex
	forceLeader bool             // believe to lead, without an election
	observe     func(firing)     // called after each decision
}

// entry is one validated schedule.
type entry struct {
	Schedule
	sched  cron.Schedule
	gained chan struct{} // leadership was (re)acquired: look back for catch-up
}

// firing reports one decision to the observe hook.
type firing struct {
	name      string
	at        time.Time
	decision  Decision
	submitted int
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

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
	if strings.ContainsAny(cfg.ID, " |") || len(cfg.ID) > 100 {
		bad("scheduler id %q: no spaces or '|', at most 100 bytes", cfg.ID)
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
		case !nameRE.MatchString(sc.Name):
			bad("%s: name must match %s", label, nameRE)
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
		s.entries = append(s.entries, &entry{Schedule: sc, sched: sched, gained: make(chan struct{}, 1)})
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	s.prefix = ks.Prefix()
	s.leaderKey = s.prefix + ":cron:leader"
	s.owner = cfg.ID + "/" + randomHex(3)
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
// leads, and the value of the fired keys it sets.
func (s *Scheduler) Owner() string { return s.owner }

// IsLeader reports whether this Scheduler currently, and surely, leads: it
// holds the mutex and its validity (as confirmed by the last acquisition or
// extension, minus redsync's drift allowance) has not run out.
func (s *Scheduler) IsLeader() bool {
	if s.forceLeader {
		return true
	}
	u := s.until.Load()
	return u != nil && time.Now().Before(*u)
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

// Run elects a leader and fires the schedules until ctx ends. On exit it
// releases leadership (Unlock) so a successor takes over at once, and waits
// for a claimed occurrence's fan-out (at most FanOutShutdownGrace). It
// returns nil when ctx ends; Run may be called once.
func (s *Scheduler) Run(ctx context.Context) error {
	if !s.started.CompareAndSwap(false, true) {
		return errors.New("triggers: Scheduler.Run called twice")
	}
	fanCtx, stopFan := context.WithCancel(context.WithoutCancel(ctx))
	defer stopFan()
	stopGrace := context.AfterFunc(ctx, func() { time.AfterFunc(FanOutShutdownGrace, stopFan) })
	defer stopGrace()

	s.log.Info("scheduler started", slog.Int("schedules", len(s.entries)),
		slog.Duration("leader_ttl", s.ttl), slog.Bool("force_leader", s.forceLeader))
	var wg sync.WaitGroup
	wg.Go(func() { s.lead(ctx) })
	for _, e := range s.entries {
		wg.Go(func() { s.loop(ctx, fanCtx, e) })
	}
	wg.Wait()
	s.log.Info("scheduler stopped")
	return nil
}

// loop waits for e's occurrences and fires the due ones while leading.
func (s *Scheduler) loop(ctx, fanCtx context.Context, e *entry) {
	var lastFired time.Time // latest occurrence this loop tried to claim
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for ctx.Err() == nil {
		now := s.now().In(s.loc)
		if s.IsLeader() {
			if t, ok := s.due(e, lastFired, now); ok {
				lastFired = t
				s.fire(fanCtx, e, t)
				continue // the fan-out took time: look again
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

// firedKey is occurrence t's idempotency key.
func (s *Scheduler) firedKey(name string, t time.Time) string {
	return s.prefix + ":cron:fired:" + name + ":" + strconv.FormatInt(t.Unix(), 10)
}

// fire claims occurrence t of e with its fired key and, when this runner
// set it, submits one request per subject.
func (s *Scheduler) fire(ctx context.Context, e *entry, t time.Time) Decision {
	log := s.log.With(slog.String("schedule", e.Name), slog.String("scope", e.Scope),
		slog.Time("occurrence", t))
	report := func(d Decision, n int) Decision {
		if s.observe != nil {
			s.observe(firing{name: e.Name, at: t, decision: d, submitted: n})
		}
		return d
	}
	subjects := e.Subjects
	if e.AllSubjects {
		var err error
		if subjects, err = s.reg.Subjects(ctx, e.Scope); err != nil {
			log.Error("schedule: reading subjects failed; occurrence not fired", slog.Any("error", err))
			return report(DecisionError, 0)
		}
	}
	if !s.IsLeader() { // never claim while unsure
		log.Info("schedule: leadership lost before the occurrence; not fired", slog.String("decision", string(DecisionNotLeader)))
		return report(DecisionNotLeader, 0)
	}
	ttl := FiredKeyTTLMin
	if next := e.sched.Next(t); !next.IsZero() {
		ttl = max(ttl, 2*next.Sub(t))
	}
	set, err := s.rdb.SetNX(ctx, s.firedKey(e.Name, t), s.owner, ttl).Result()
	if err != nil {
		log.Error("schedule: claiming the occurrence failed; not fired", slog.Any("error", err),
			slog.String("decision", string(DecisionError)))
		return report(DecisionError, 0)
	}
	if !set {
		log.Debug("schedule: occurrence already fired", slog.String("decision", string(DecisionDuplicate)))
		return report(DecisionDuplicate, 0)
	}
	submitted, failed := 0, 0
	for _, subj := range subjects {
		key := subj + taskkey.Separator + e.Scope
		res, err := s.reg.Submit(ctx, subj, e.Scope, jobs.SubmitOptions{Source: jobs.SourceSchedule})
		if err != nil {
			failed++
			log.Error("schedule: submit failed", slog.String("task_key", key),
				slog.String("source", string(jobs.SourceSchedule)), slog.Any("error", err))
			continue
		}
		submitted++
		log.Debug("schedule: request", slog.String("task_key", key), slog.String("run_id", res.Task.RunID),
			slog.String("source", string(jobs.SourceSchedule)), slog.String("outcome", string(res.Outcome)))
	}
	log.Info("schedule fired", slog.String("decision", string(DecisionFired)),
		slog.Int("subjects", len(subjects)), slog.Int("submitted", submitted), slog.Int("failed", failed))
	return report(DecisionFired, submitted)
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
