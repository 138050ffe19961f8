package jobs

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/tasklease/tasklease/checkpoints"
	"github.com/tasklease/tasklease/internal/groupcommit"
	"github.com/tasklease/tasklease/internal/keyspace"
	"github.com/tasklease/tasklease/internal/slotmap"
	"github.com/tasklease/tasklease/leasing"
	"github.com/tasklease/tasklease/lua"
	"github.com/tasklease/tasklease/taskkey"
)

// Registry defaults.
const (
	// RetentionDefault: finished records and their history expire after a
	// week unless a new run starts.
	RetentionDefault = 7 * 24 * time.Hour
	// ListLimitDefault is List's page size when ListOptions.Limit is 0.
	ListLimitDefault = 100
	// ListLimitMax caps ListOptions.Limit.
	ListLimitMax = 1000
	// HistoryLimitDefault is History's default page size.
	HistoryLimitDefault = 50
)

// Config configures a Registry.
type Config struct {
	// Prefix of every Redis key (default "tasklease").
	Prefix string
	// Partitions (default 16); fixed for a deployment's life.
	Partitions int
	// HistoryCap bounds each key's history (default 200 events).
	HistoryCap int
	// Retention of finished records and history (default RetentionDefault).
	Retention time.Duration
	// Jobs are the scopes this registry accepts, with their stages.
	Jobs []Job
	// Limiters are the named fleet-wide limiters jobs use (Job.Limiters).
	Limiters []Limiter
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// Metrics, when set, receives tasklease's Prometheus collectors.
	Metrics prometheus.Registerer
	// TracerProvider, when set, turns tracing on (see tracing.go): spans
	// for submits, runs (linked to their requests) and stages.
	TracerProvider trace.TracerProvider
}

// Registry is the one place every trigger goes through: it records
// requests, decides by conflict policy whether a run starts, and answers
// what is running. It never executes work (a Runner does). Safe for
// concurrent use; cheap enough to share per process.
type Registry struct {
	rdb redis.UniversalClient
	gc  *groupcommit.Client // scripts go through it: concurrent calls share round trips
	// singleNode: rdb is one Redis (standalone or Sentinel-managed), where
	// a script may touch keys of several partitions, so batched scripts
	// span partitions; on Cluster (or a Ring) each call stays in one
	// partition's slot.
	singleNode bool
	// clientOpts: a copy of rdb's options when it is a *redis.Client,
	// taken once here for the idle wait's client (waitClient): go-redis
	// writes its options while it initialises a connection, so a copy
	// taken by a runner started beside another runner's traffic races.
	clientOpts *redis.Options
	submits    *groupcommit.Combiner[*submitReq]
	ks         *keyspace.Space
	histCap    int
	retention  time.Duration
	jobs       map[string]*Job
	scopes     []string
	stagesCSV  map[string]string // scope → comma-joined stage names
	log        *slog.Logger
	metrics    *Metrics
	leases     *leasing.Manager
	store      *checkpoints.Store
	scripts    scripts
	hub        *hub         // the one pub/sub connection of this Registry
	tracer     trace.Tracer // nil: tracing off
	// limiters by name, the jobs' own included ("job.<scope>"), and the
	// limiters each limited job's runs hold, in the order they take them.
	limiters  map[string]*limiterDef
	jobLimits map[string][]*limiterDef
}

// isCluster reports whether rdb is a Redis Cluster client.
func isCluster(rdb redis.UniversalClient) bool {
	_, ok := rdb.(*redis.ClusterClient)
	return ok
}

// isSingleNode reports whether rdb talks to one Redis server.
func isSingleNode(rdb redis.UniversalClient) bool {
	_, ok := rdb.(*redis.Client)
	return ok
}

type scripts struct {
	submit, submitMany, claim, readNext, readIdle, reclaim, heartbeat, finish, cancel, retryMove, janitor, resume, runnerBeat *redis.Script
	limiterAcquire, limiterRenew, limiterRelease, limiterWait                                                                 *redis.Script
}

// NewRegistry validates cfg and returns a Registry on rdb.
func NewRegistry(rdb redis.UniversalClient, cfg Config) (*Registry, error) {
	if rdb == nil {
		return nil, fmt.Errorf("%w: nil redis client", ErrConfig)
	}
	// A Cluster client must follow failovers: go-redis alone keeps a dead
	// master's slots for up to a minute (internal/slotmap). (Its
	// leasing.Manager, on the same client, adds a second hook; reloads
	// asked for at once are merged.)
	slotmap.Follow(rdb)
	ks, err := keyspace.New(cfg.Prefix, cfg.Partitions)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if cfg.HistoryCap == 0 {
		cfg.HistoryCap = checkpoints.HistoryCapDefault
	}
	if cfg.Retention == 0 {
		cfg.Retention = RetentionDefault
	}
	if cfg.Retention < 0 || cfg.HistoryCap < 1 {
		return nil, fmt.Errorf("%w: retention and history cap must be positive", ErrConfig)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	// The due index needs the partitions' keys and its own in one call: a
	// single Redis server or a Sentinel's primary.
	libOpts := lua.LibraryOptions{ShardedPubSub: isCluster(rdb), DueIndex: isSingleNode(rdb)}
	lib, err := lua.NewLibrary(libOpts)
	if err != nil {
		return nil, err
	}
	gc, err := groupcommit.New(rdb, groupcommit.Config{Library: lib})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	var clientOpts *redis.Options
	if c, ok := rdb.(*redis.Client); ok {
		o := *c.Options()
		clientOpts = &o
	}
	r := &Registry{
		clientOpts: clientOpts,
		rdb:        rdb, gc: gc, singleNode: isSingleNode(rdb), ks: ks, histCap: cfg.HistoryCap, retention: cfg.Retention,
		jobs: make(map[string]*Job, len(cfg.Jobs)), stagesCSV: make(map[string]string, len(cfg.Jobs)),
		log: cfg.Logger, metrics: newMetrics(), hub: newHub(rdb, nil),
		scripts: scripts{
			submit:     lua.MustScriptWith("submit", libOpts),
			submitMany: lua.MustScriptWith("submit_many", libOpts),
			janitor:    lua.MustScriptWith("janitor", libOpts),
			claim:      lua.MustScriptWith("claim", libOpts),
			readNext:   lua.MustScriptWith("read_next", libOpts),
			readIdle:   lua.MustScriptWith("read_idle", libOpts),
			reclaim:    lua.MustScriptWith("reclaim", libOpts),
			heartbeat:  lua.MustScriptWith("heartbeat", libOpts),
			finish:     lua.MustScriptWith("finish", libOpts),
			cancel:     lua.MustScriptWith("cancel", libOpts),
			retryMove:  lua.MustScriptWith("retry_move", libOpts),
			resume:     lua.MustScriptWith("resume", libOpts),
			runnerBeat: lua.MustScriptWith("runner_beat", libOpts),

			limiterAcquire: lua.MustScriptWith("limiter_acquire", libOpts),
			limiterRenew:   lua.MustScriptWith("limiter_renew", libOpts),
			limiterRelease: lua.MustScriptWith("limiter_release", libOpts),
			limiterWait:    lua.MustScriptWith("limiter_wait", libOpts),
		},
	}
	if isCluster(rdb) {
		// Sharded pub/sub needs Redis 7, as the library that SPUBLISHes:
		// subscribers use SSUBSCRIBE exactly when the scripts run as it.
		r.hub.sharded = func(ctx context.Context) (bool, error) {
			if err := gc.LoadFunctions(ctx); err != nil {
				return false, err
			}
			return gc.FunctionsLoaded(ctx), nil
		}
	}
	if cfg.TracerProvider != nil {
		r.tracer = cfg.TracerProvider.Tracer(tracerName)
	}
	r.submits = groupcommit.NewCombiner(groupcommit.CombinerConfig{
		MaxInFlight: submitsInFlight, MaxBatch: submitBatchMax, Balanced: true}, r.flushSubmits)
	for i := range cfg.Jobs {
		j := cfg.Jobs[i] // copy: defaults must not leak into the caller's slice
		j.Stages = slices.Clone(j.Stages)
		if err := j.normalize(); err != nil {
			return nil, err
		}
		if _, dup := r.jobs[j.Scope]; dup {
			return nil, fmt.Errorf("%w: duplicate job %s", ErrConfig, j.Scope)
		}
		r.jobs[j.Scope] = &j
		r.scopes = append(r.scopes, j.Scope)
		r.stagesCSV[j.Scope] = strings.Join(j.StageNames(), ",")
	}
	slices.Sort(r.scopes)
	if err := r.buildLimiters(cfg.Limiters); err != nil {
		return nil, err
	}
	if r.leases, err = leasing.NewManager(rdb, leasing.Config{Prefix: ks.Prefix(), Partitions: ks.Partitions(), FenceTTL: cfg.Retention}); err != nil {
		return nil, err
	}
	if r.store, err = checkpoints.NewStore(rdb, checkpoints.Config{Prefix: ks.Prefix(), Partitions: ks.Partitions(),
		HistoryCap: cfg.HistoryCap, Scripter: gc}); err != nil {
		return nil, err
	}
	if cfg.Metrics != nil {
		if err := r.metrics.register(cfg.Metrics, r.QueueDepth, r.Limiters); err != nil {
			return nil, fmt.Errorf("%w: metrics: %w", ErrConfig, err)
		}
	}
	return r, nil
}

// Job returns the job of scope.
func (r *Registry) Job(scope string) (Job, bool) {
	j, ok := r.jobs[scope]
	if !ok {
		return Job{}, false
	}
	return *j, true
}

// Prefix returns the Redis key prefix, for companions (such as the cron
// scheduler) that keep their own keys beside the registry's.
func (r *Registry) Prefix() string { return r.ks.Prefix() }

// Scopes returns the registered scopes, sorted.
func (r *Registry) Scopes() []string { return slices.Clone(r.scopes) }

// Ping checks that Redis answers.
func (r *Registry) Ping(ctx context.Context) error { return r.rdb.Ping(ctx).Err() }

// key validates subject and scope: a typed error, and nothing sent to Redis,
// for bad input.
func (r *Registry) key(subject, scope string) (taskkey.Key, *Job, error) {
	k, err := taskkey.New(subject, scope)
	if err != nil {
		return taskkey.Key{}, nil, err
	}
	j, ok := r.jobs[scope]
	if !ok {
		return taskkey.Key{}, nil, fmt.Errorf("%w: %q", ErrUnknownScope, scope)
	}
	return k, j, nil
}

// SubmitOptions qualify a request. Zero values: source manual, the job's
// conflict policy.
type SubmitOptions struct {
	Source Source // why the request is made
	Policy Policy // overrides the job's conflict policy when set
	// Delay and NotBefore delay the run the request starts: with no
	// active run, the run is created queued and not started before the
	// later of Redis time + Delay and NotBefore (the view's NotBefore; it
	// starts within a reclaim interval after that). A request without a
	// delay that joins a delayed run — a person's "sync now" — starts it
	// at once; a delayed request that finds a run active is answered as
	// any other. Delay must be in 0..DelayMax; a NotBefore in the past
	// delays nothing.
	Delay     time.Duration
	NotBefore time.Time
	// Group is the request's fair-share group, for a job whose fairness
	// groups by request (FairnessRequest): while runs wait for a limiter,
	// the groups take turns. Only the request that starts a run sets it
	// (a join changes nothing; a follow-up keeps the group of the run
	// before it). At most GroupMax bytes, printable, no spaces, no '|'
	// (ValidateGroup); "" is no group, and costs nothing.
	Group string
}

// DelayMax bounds SubmitOptions.Delay (and how far ahead NotBefore may be).
const DelayMax = 30 * 24 * time.Hour

// DebounceMaxDefault is Job.DebounceMax when Debounce is set.
const DebounceMaxDefault = time.Minute

// SubmitResult is the registry's answer to a request.
type SubmitResult struct {
	// Outcome is what Submit did with the request: started, joined, ...
	Outcome Outcome `json:"outcome"`
	// RunID is the run that serves the request: the run it started or
	// joined, or for queued and replaced the follow-up, whose id is fixed
	// when the first request queues it (Task still shows the active run).
	// Empty when the request was skipped or throttled. Follow this run to
	// know how the request ended.
	RunID string `json:"runId,omitempty"`
	// Task is the task's view after the request.
	Task TaskView `json:"task"`
}

// Submit routes a request for subject|scope through the registry in one
// Lua script: if no run is active one is created and queued; otherwise the
// conflict policy decides (join, skip, queue, replace). The result carries
// the task's view, e.g. the running run a request joined, and the run that
// serves the request (RunID), under which its history records it. Invalid input
// returns a typed error (taskkey.ErrInvalid, ErrUnknownScope,
// ErrInvalidSource, ErrInvalidPolicy, ErrInvalidDelay, ErrInvalidGroup) and
// writes nothing.
func (r *Registry) Submit(ctx context.Context, subject, scope string, opts SubmitOptions) (SubmitResult, error) {
	k, job, err := r.key(subject, scope)
	if err != nil {
		return SubmitResult{}, err
	}
	if opts.Source == "" {
		opts.Source = SourceManual
	}
	if _, err := ParseSource(string(opts.Source)); err != nil {
		return SubmitResult{}, err
	}
	if opts.Policy == "" {
		opts.Policy = job.OnConflict
	}
	if _, err := ParsePolicy(string(opts.Policy)); err != nil {
		return SubmitResult{}, err
	}
	if opts.Delay < 0 || opts.Delay > DelayMax || time.Until(opts.NotBefore) > DelayMax {
		return SubmitResult{}, fmt.Errorf("%w: delay %s, not before %s (want at most %s ahead)", ErrInvalidDelay,
			opts.Delay, opts.NotBefore.Format(time.RFC3339), DelayMax)
	}
	if err := ValidateGroup(opts.Group); err != nil {
		return SubmitResult{}, err
	}
	ctx, span := r.startSubmitSpan(ctx, k, opts.Source)
	out, err := r.submit(ctx, k, job, opts)
	r.endSubmitSpan(ctx, span, k, out, err)
	return out, err
}

func (r *Registry) submit(ctx context.Context, k taskkey.Key, job *Job, opts SubmitOptions) (SubmitResult, error) {
	scope := k.Scope()
	req := &submitReq{k: k, p: r.ks.Partition(k), source: opts.Source, policy: opts.Policy,
		runID: newRunID(), stages: r.stagesCSV[scope], maxAttempts: job.Retry.MaxAttempts,
		minInterval: job.MinInterval.Milliseconds(), delay: opts.Delay.Milliseconds(), group: opts.Group}
	if job.Debounce > 0 && opts.Source != SourceManual && opts.Delay == 0 && opts.NotBefore.IsZero() {
		req.delay, req.debounceMax = job.Debounce.Milliseconds(), job.DebounceMax.Milliseconds()
	}
	if !opts.NotBefore.IsZero() {
		req.notBefore = opts.NotBefore.UnixMilli()
	}
	if r.tracer != nil {
		req.traceparent = traceparent(ctx)
	}
	if err := r.submits.Add(ctx, req); err != nil {
		return SubmitResult{}, fmt.Errorf("jobs: submit %s: %w", k, err)
	}
	if req.err != nil {
		return SubmitResult{}, fmt.Errorf("jobs: submit %s: %w", k, req.err)
	}
	out := SubmitResult{Outcome: Outcome(req.outcome), Task: req.taskView()}
	out.RunID = req.servedBy(out.Task)
	r.metrics.requests.WithLabelValues(scope, string(opts.Source), string(out.Outcome)).Inc()
	r.log.LogAttrs(ctx, slog.LevelDebug, "request",
		slog.String("task_key", k.String()), slog.String("run_id", cmp.Or(out.RunID, out.Task.RunID)),
		slog.String("source", string(opts.Source)), slog.String("outcome", string(out.Outcome)))
	return out, nil
}

// Get returns the task's view; ErrNotFound when the key never ran (or its
// record expired).
func (r *Registry) Get(ctx context.Context, subject, scope string) (TaskView, error) {
	k, _, err := r.key(subject, scope)
	if err != nil {
		return TaskView{}, err
	}
	f, err := r.rdb.HGetAll(ctx, r.ks.Task(k)).Result()
	if err != nil {
		return TaskView{}, fmt.Errorf("jobs: get %s: %w", k, err)
	}
	if len(f) == 0 || f["runId"] == "" {
		return TaskView{}, fmt.Errorf("%w: %s", ErrNotFound, k)
	}
	return viewFromRecord(f), nil
}

// ListOptions filter List. Empty fields match everything.
type ListOptions struct {
	Status  Status // keeps the tasks in this status
	Scope   string // keeps one job's tasks
	Subject string // keeps one subject's tasks
	// SubjectPrefix keeps the subjects that start with it.
	SubjectPrefix string
	// Sort (default ListSortUpdated).
	Sort ListSort
	// Limit (default ListLimitDefault, at most ListLimitMax) and Offset
	// select the page.
	Limit  int
	Offset int
}

// List returns a page of task views, most recently updated first (see
// ListPage, which also counts the matching tasks).
func (r *Registry) List(ctx context.Context, opts ListOptions) ([]TaskView, error) {
	page, err := r.ListPage(ctx, opts)
	return page.Tasks, err
}

// listScanMax bounds how many index entries one List reads per partition.
const listScanMax = 5000

// History returns the key's history events, newest first (default
// HistoryLimitDefault, at most the history cap). Coalesced repeats of a
// request carry their count and last time.
func (r *Registry) History(ctx context.Context, subject, scope string, limit int) ([]Event, error) {
	k, _, err := r.key(subject, scope)
	if err != nil {
		return nil, err
	}
	if limit <= 0 {
		limit = HistoryLimitDefault
	}
	evs, err := readHistory(ctx, r.rdb, r.ks, k, min(limit, r.histCap))
	if err != nil {
		return nil, fmt.Errorf("jobs: history %s: %w", k, err)
	}
	return evs, nil
}

// CancelOutcome is what Cancel did.
type CancelOutcome string

// Cancel outcomes.
const (
	// CancelCancelled: the run was not executing and is now cancelled.
	CancelCancelled CancelOutcome = "cancelled"
	// CancelCancelling: the run is executing; its holder stops it and
	// records it as cancelled.
	CancelCancelling CancelOutcome = "cancelling"
	// CancelNotRunning: no active run.
	CancelNotRunning CancelOutcome = "not_running"
)

// Cancel cancels the task's active run through the registry: a persisted
// flag plus a publish, so the holder stops at once (or at its next
// heartbeat if it missed the publish). A queued follow-up is dropped too.
// Clients never touch a lease directly.
func (r *Registry) Cancel(ctx context.Context, subject, scope string) (CancelOutcome, error) {
	k, _, err := r.key(subject, scope)
	if err != nil {
		return "", err
	}
	p := r.ks.Partition(k)
	keys := append([]string{r.ks.Task(k), r.ks.History(k), r.ks.Retry(p), r.ks.Watch(p)}, r.ks.QueueKeys(p)...)
	res, err := r.scripts.cancel.Run(ctx, r.gc, keys, r.histCap, r.ks.Events(p), r.ks.Cancels(p), r.retention.Milliseconds(), "registry").Text()
	if err != nil {
		return "", fmt.Errorf("jobs: cancel %s: %w", k, err)
	}
	return CancelOutcome(res), nil
}

// CancelSubject cancels the active runs of every scope of subject — what an
// account switch needs when the old account's work must stop. It returns
// the outcome per scope.
func (r *Registry) CancelSubject(ctx context.Context, subject string) (map[string]CancelOutcome, error) {
	if err := taskkey.ValidateSubject(subject); err != nil {
		return nil, err
	}
	out := make(map[string]CancelOutcome, len(r.scopes))
	for _, scope := range r.scopes {
		o, err := r.Cancel(ctx, subject, scope)
		if err != nil {
			return out, err
		}
		out[scope] = o
	}
	return out, nil
}

// QueueDepth returns the number of requests in the partitions' request
// queues (both lanes and the entries taken by runners: waiting, being
// claimed or executing) and in the retry queues.
func (r *Registry) QueueDepth(ctx context.Context) (queued, retry int64, err error) {
	pipe := r.rdb.Pipeline()
	var xl, zc []*redis.IntCmd
	for p := range r.ks.Partitions() {
		for _, l := range keyspace.Lanes() {
			xl = append(xl, pipe.LLen(ctx, r.ks.Queue(p, l)))
		}
		xl = append(xl, pipe.ZCard(ctx, r.ks.Taken(p)))
		zc = append(zc, pipe.ZCard(ctx, r.ks.Retry(p)))
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return 0, 0, fmt.Errorf("jobs: queue depth: %w", err)
	}
	for _, c := range xl {
		queued += c.Val()
	}
	for _, c := range zc {
		retry += c.Val()
	}
	return queued, retry, nil
}

// Subscribe delivers a TaskView for every state change until ctx ends (the
// channel is then closed). Views come from Redis pub/sub over the one
// connection the Registry shares among all its subscribers: a slow reader
// loses messages rather than blocking Redis or the other subscribers; Get
// the task for a fresh view.
func (r *Registry) Subscribe(ctx context.Context) (<-chan TaskView, error) {
	chans := make([]string, r.ks.Partitions())
	for p := range chans {
		chans[p] = r.ks.Events(p)
	}
	// Scripts publish views only while the watch keys exist: set them
	// before subscribing and keep them alive while subscribed.
	if err := r.watch(ctx); err != nil {
		return nil, fmt.Errorf("jobs: subscribe: %w", err)
	}
	sub, err := r.hub.subscribe(ctx, chans)
	if err != nil {
		return nil, err
	}
	out := make(chan TaskView, 64)
	go func() {
		defer close(out)
		defer sub.Close()
		refresh := time.NewTicker(WatchTTL / 3)
		defer refresh.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-refresh.C:
				if err := r.watch(ctx); err != nil && ctx.Err() == nil {
					r.log.Warn("refreshing the event watch keys failed", slog.Any("error", err))
				}
			case m := <-sub.C:
				var f map[string]string
				if err := json.Unmarshal([]byte(m.Payload), &f); err != nil {
					continue
				}
				select {
				case out <- viewFromRecord(f):
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out, nil
}

// WatchTTL is how long views keep being published after the last
// subscriber stopped refreshing the watch keys.
const WatchTTL = 30 * time.Second

// watch (re)sets every partition's watch key for WatchTTL.
func (r *Registry) watch(ctx context.Context) error {
	pipe := r.rdb.Pipeline()
	for p := range r.ks.Partitions() {
		pipe.Set(ctx, r.ks.Watch(p), "1", WatchTTL)
	}
	_, err := pipe.Exec(ctx)
	return err
}

// replyString is fmt.Sprint for the strings a script replies with, without
// fmt's allocations.
func replyString(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case int64:
		return strconv.FormatInt(x, 10)
	case nil:
		return ""
	}
	return fmt.Sprint(v)
}

func newRunID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
