package jobs

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Presence defaults: every runner refreshes its own record in the runner
// registry (GET /v1/runners).
const (
	// PresenceIntervalDefault is how often a runner refreshes its record
	// (Sidekiq's processes beat as often): four Redis commands a beat, a
	// runner shown gone 30 s after its last. Nothing but the registry's
	// view depends on it — leases and their recovery have their own TTL.
	PresenceIntervalDefault = 10 * time.Second
	// presenceMissed is how many refreshes a runner may miss before it is
	// shown gone.
	presenceMissed = 3
	// presenceKeep is how long a gone runner's record stays listed (and its
	// finished-run counts keep counting in the last hour's figures).
	presenceKeep = time.Hour
	// presenceUpkeepEvery is how often a runner's beat also drops gone
	// runners' records and extends the registry's expiry (presenceKeep
	// after the last beat, to within this): a beat without them is three
	// Redis commands where it was six.
	presenceUpkeepEvery = time.Minute
	// statsMinutes is how many minutes of finished-run counts a record
	// carries: the last hour.
	statsMinutes = 60
)

// RunnerInfo is one runner as GET /v1/runners shows it. Times are Redis
// time, except StartedAt, which is the runner's own clock corrected by its
// offset from Redis.
type RunnerInfo struct {
	// Owner is the runner's lease owner (Runner.Owner): ID and a suffix
	// per process.
	Owner string `json:"owner"`
	// ID is the configured RunnerConfig.ID, e.g. the pod name.
	ID string `json:"id"`
	// Version is RunnerConfig.Version (by default the build's).
	Version string `json:"version"`
	// Concurrency is the runner's RunnerConfig.Concurrency.
	Concurrency int `json:"concurrency"`
	Active      int `json:"active"` // runs claimed or executing there; 0 once gone: a gone runner holds nothing
	// StartedAt is when the runner started.
	StartedAt time.Time `json:"startedAt"`
	// HeartbeatAt is the runner's last refresh of its record.
	HeartbeatAt time.Time `json:"heartbeatAt"`
	// Alive: the runner refreshed its record within the last
	// presenceMissed intervals and has not stopped.
	Alive bool `json:"alive"`
	// HeartbeatAgeSeconds is how long before the listing HeartbeatAt was.
	HeartbeatAgeSeconds float64 `json:"heartbeatAgeSeconds"`
	// StoppedAt is when the runner stopped cleanly (Run returned); nil
	// while it runs and after a crash.
	StoppedAt *time.Time `json:"stoppedAt,omitempty"`
	// Interval is how often the runner refreshes its record.
	IntervalSeconds float64 `json:"intervalSeconds"`
	// Finished counts the runs this runner finished per minute and scope,
	// over the last hour (minutes with none are left out).
	Finished []FinishedCount `json:"finished,omitempty"`
}

// FinishedCount is the number of runs of Scope that ended done or failed
// in the minute starting at Minute (unix seconds, Redis time).
type FinishedCount struct {
	Minute int64  `json:"minute"`
	Scope  string `json:"scope"`
	Done   int    `json:"done"`
	Failed int    `json:"failed"`
}

// presence is a Runner's record in the runner registry and the finished-run
// counts it publishes there. Counting in the runner costs the hot path
// nothing in Redis: the counts travel with the record every interval.
type presence struct {
	mu       sync.Mutex
	started  time.Time
	offset   time.Duration // Redis time − local time, from the last beat
	counts   map[presenceBucket]*[2]int
	stopped  bool
	version  string
	interval time.Duration
	upkeepAt time.Time // the last beat that did the registry's upkeep
}

type presenceBucket struct {
	minute int64
	scope  string
}

func newPresence(interval time.Duration, version string) *presence {
	if version == "" {
		version = BuildVersion()
	}
	return &presence{started: time.Now(), counts: map[presenceBucket]*[2]int{}, version: version, interval: interval}
}

// BuildVersion is the main module's version from the build info.
func BuildVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}

// finished counts a run of scope that ended done (ok) or failed.
func (p *presence) finished(scope string, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	b := presenceBucket{minute: time.Now().Add(p.offset).Unix() / 60 * 60, scope: scope}
	c := p.counts[b]
	if c == nil {
		c = &[2]int{}
		p.counts[b] = c
	}
	if ok {
		c[0]++
	} else {
		c[1]++
	}
}

// countFinished counts a finished run (done or failed; cancelled runs are
// not counted) in this runner's presence record.
func (r *Runner) countFinished(scope, result string) {
	switch Status(result) {
	case StatusDone:
		r.presence.finished(scope, true)
	case StatusFailed:
		r.presence.finished(scope, false)
	}
}

// record renders the presence record, dropping counts older than an hour.
func (p *presence) record(r *Runner) ([]byte, error) {
	// Runs claimed or executing here: slots also count reads in flight.
	r.mu.Lock()
	active := len(r.active)
	r.mu.Unlock()
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now().Add(p.offset)
	info := RunnerInfo{Owner: r.owner, ID: r.cfg.ID, Version: p.version, Concurrency: r.cfg.Concurrency,
		Active: active, StartedAt: p.started.Add(p.offset).UTC(), IntervalSeconds: p.interval.Seconds()}
	if p.stopped {
		t := now.UTC()
		info.StoppedAt = &t
	}
	oldest := now.Unix()/60*60 - (statsMinutes-1)*60
	for b, c := range p.counts {
		if b.minute < oldest {
			delete(p.counts, b)
			continue
		}
		info.Finished = append(info.Finished, FinishedCount{Minute: b.minute, Scope: b.scope, Done: c[0], Failed: c[1]})
	}
	slices.SortFunc(info.Finished, func(a, b FinishedCount) int {
		return cmp.Or(cmp.Compare(a.Minute, b.Minute), cmp.Compare(a.Scope, b.Scope))
	})
	return json.Marshal(info)
}

// beat writes the record once; the reply's Redis time corrects the offset.
func (r *Runner) beat(ctx context.Context) error {
	rec, err := r.presence.record(r)
	if err != nil {
		return err
	}
	sent := time.Now()
	r.presence.mu.Lock()
	upkeep := sent.Sub(r.presence.upkeepAt) >= presenceUpkeepEvery
	r.presence.mu.Unlock()
	res, err := r.reg.scripts.runnerBeat.Run(ctx, r.reg.gc, []string{r.reg.ks.Runners(), r.reg.ks.RunnerBeats(), r.reg.ks.TokenFloor()},
		r.owner, rec, presenceKeep.Milliseconds(), boolFlag(upkeep), r.tokenFloor()).Slice()
	if err != nil {
		return fmt.Errorf("jobs: runner beat: %w", err)
	}
	if len(res) != 2 {
		return fmt.Errorf("jobs: runner beat: unexpected reply %v", res)
	}
	ms, err := strconv.ParseInt(replyString(res[0]), 10, 64) // now_ms: a decimal string
	if err != nil {
		return fmt.Errorf("jobs: runner beat: time %v: %w", res[0], err)
	}
	if floor, err := strconv.ParseInt(replyString(res[1]), 10, 64); err == nil {
		r.sawToken(floor)
	}
	if r.nodeWait != nil {
		r.nodeWait.raisedFloor(ctx, r.tokenFloor())
	}
	// Redis read its clock about halfway through the round trip.
	mid := sent.Add(time.Since(sent) / 2)
	r.presence.mu.Lock()
	r.presence.offset = time.UnixMilli(ms).Sub(mid)
	if upkeep {
		r.presence.upkeepAt = sent
	}
	r.presence.mu.Unlock()
	return nil
}

// presenceLoop refreshes the record until ctx ends.
func (r *Runner) presenceLoop(ctx context.Context) {
	r.beatLogged(ctx)
	r.every(ctx, r.presence.interval, r.beatLogged)
}

// beatLogged is beat, its failure logged.
func (r *Runner) beatLogged(ctx context.Context) {
	if err := r.beat(ctx); err != nil && ctx.Err() == nil {
		r.log.Warn("runner registry refresh failed", slog.String("component", "presence"), slog.Any("error", err))
	}
}

// leave marks the record stopped, so the runner is shown gone at once
// rather than after missed refreshes. Best effort.
func (r *Runner) leave() {
	r.presence.mu.Lock()
	r.presence.stopped = true
	r.presence.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), handBackTimeout)
	defer cancel()
	if err := r.beat(ctx); err != nil {
		r.log.Warn("runner registry: could not record the stop", slog.String("component", "presence"), slog.Any("error", err))
	}
}

// Runners returns the runners of the last hour, alive first, then by owner:
// one pipelined read of the registry and Redis time.
func (r *Registry) Runners(ctx context.Context) ([]RunnerInfo, error) {
	out, _, err := r.runnersAt(ctx)
	return out, err
}

// runnersAt is Runners and the Redis time it was read at.
func (r *Registry) runnersAt(ctx context.Context) ([]RunnerInfo, time.Time, error) {
	pipe := r.rdb.Pipeline()
	recs := pipe.HGetAll(ctx, r.ks.Runners())
	beats := pipe.ZRangeWithScores(ctx, r.ks.RunnerBeats(), 0, -1)
	now := pipe.Time(ctx)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, time.Time{}, fmt.Errorf("jobs: runners: %w", err)
	}
	last := make(map[string]int64, len(beats.Val()))
	for _, z := range beats.Val() {
		last[fmt.Sprint(z.Member)] = int64(z.Score)
	}
	t := now.Val()
	out := make([]RunnerInfo, 0, len(recs.Val()))
	for owner, raw := range recs.Val() {
		var info RunnerInfo
		if err := json.Unmarshal([]byte(raw), &info); err != nil {
			continue // a record of an incompatible version: not listable
		}
		ms, ok := last[owner]
		if !ok {
			continue
		}
		info.Owner = owner
		info.HeartbeatAt = time.UnixMilli(ms).UTC()
		age := t.Sub(info.HeartbeatAt)
		info.HeartbeatAgeSeconds = max(0, age.Seconds())
		interval := time.Duration(info.IntervalSeconds * float64(time.Second))
		if interval <= 0 {
			interval = PresenceIntervalDefault
		}
		info.Alive = info.StoppedAt == nil && age <= presenceMissed*interval
		if !info.Alive {
			info.Active = 0 // its last report, not what it holds now
		}
		out = append(out, info)
	}
	slices.SortFunc(out, func(a, b RunnerInfo) int {
		if a.Alive != b.Alive {
			if a.Alive {
				return -1
			}
			return 1
		}
		return cmp.Compare(a.Owner, b.Owner)
	})
	return out, t, nil
}
