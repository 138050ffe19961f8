// Package checkpoints keeps each task key's run record — completed stages,
// current stage, progress cursor, attempt, timestamps — and decides how a
// recovered run continues.
//
// The record is one Redis hash per task key (the same hash the engine shows
// as a TaskView). Every write is fenced: a Lua compare-and-set on the lease's
// owner and fencing token and on the run id, so a runner that lost its lease
// (crash, pause, partition) can write nothing afterwards; it gets
// leasing.ErrNotHeld.
//
// Stages run in order, so a checkpoint stores how many leading stages are
// done. Decide turns a checkpoint into restart, resume or skip (the seed's
// rule): no checkpoint → restart; every stage done → skip; otherwise resume
// at the first incomplete stage with the saved cursor. A completed stage is
// never handed out again within the same run.
package checkpoints

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/keyspace"
	"github.com/tasklease/tasklease/leasing"
	"github.com/tasklease/tasklease/lua"
	"github.com/tasklease/tasklease/taskkey"
)

// HistoryCapDefault bounds each key's history (events kept).
const HistoryCapDefault = 200

// Sentinel errors; test with errors.Is. Writes by a runner that no longer
// holds the lease fail with leasing.ErrNotHeld.
var (
	// ErrNotFound: the key has no run record.
	ErrNotFound = errors.New("checkpoints: no run record")
	// ErrStageMismatch: Advance named a stage that is not the current one.
	ErrStageMismatch = errors.New("checkpoints: not the current stage")
	// ErrConfig: invalid configuration or argument.
	ErrConfig = errors.New("checkpoints: invalid config")
)

// Mode is a recovery decision.
type Mode string

// Recovery decisions (docs/concepts.md).
const (
	// Restart: nothing was checkpointed; run every stage from the start.
	Restart Mode = "restart"
	// Resume: run from the first incomplete stage, with the saved cursor.
	Resume Mode = "resume"
	// Skip: every stage is done; only finalise the run.
	Skip Mode = "skip"
)

// Checkpoint is a run's progress as stored in Redis.
type Checkpoint struct {
	// RunID is the run the record belongs to. Begin with another run id
	// starts a fresh record; writes naming another run id are refused.
	RunID     string
	Stages    []string // the run's ordered stages
	Completed int      // Stages[:Completed] are done
	Stage     string   // current stage ("" when none)
	Cursor    []byte   // progress inside the current stage
	// Attempt counts the Begins of this run: 1 for the first holder, 2
	// after one recovery, and so on.
	Attempt int
	// Owner is the lease owner that began the current attempt.
	Owner string
	// Token is that holder's fencing token.
	Token     int64
	StartedAt time.Time // Redis time
	UpdatedAt time.Time // Redis time
}

// CompletedStages returns the names of the done stages.
func (c *Checkpoint) CompletedStages() []string {
	return c.Stages[:min(c.Completed, len(c.Stages))]
}

// Recovery says where a run continues.
type Recovery struct {
	// Mode is Restart, Resume or Skip.
	Mode Mode
	// StageIndex is the first stage to run (len(Stages) for Skip).
	StageIndex int
	// Stage is Stages[StageIndex], "" for Skip.
	Stage string
	// Cursor is the saved progress inside Stage (Resume only).
	Cursor []byte
}

// Decide returns the recovery decision for a checkpoint; nil means none.
func Decide(cp *Checkpoint) Recovery {
	if cp == nil || (cp.Completed == 0 && len(cp.Cursor) == 0) {
		r := Recovery{Mode: Restart}
		if cp != nil && len(cp.Stages) > 0 {
			r.Stage = cp.Stages[0]
		}
		return r
	}
	if cp.Completed >= len(cp.Stages) {
		return Recovery{Mode: Skip, StageIndex: len(cp.Stages)}
	}
	return Recovery{Mode: Resume, StageIndex: cp.Completed, Stage: cp.Stages[cp.Completed], Cursor: cp.Cursor}
}

// Config places run records in Redis; it must match the leasing.Config of
// the leases that fence them.
type Config struct {
	Prefix     string // default "tasklease"
	Partitions int    // default 16
	// HistoryCap bounds each key's history (default
	// HistoryCapDefault).
	HistoryCap int
	// Scripter runs the scripts (default: the Store's client). The engine
	// passes a client that groups concurrent calls into shared round trips.
	Scripter redis.Scripter
}

// Store reads and writes run records. Safe for concurrent use.
type Store struct {
	rdb                      redis.UniversalClient
	scripter                 redis.Scripter
	ks                       *keyspace.Space
	histCap                  int
	begin, advance, progress *redis.Script
}

// NewStore validates cfg and returns a Store on rdb.
func NewStore(rdb redis.UniversalClient, cfg Config) (*Store, error) {
	if rdb == nil {
		return nil, fmt.Errorf("%w: nil redis client", ErrConfig)
	}
	ks, err := keyspace.New(cfg.Prefix, cfg.Partitions)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if cfg.HistoryCap == 0 {
		cfg.HistoryCap = HistoryCapDefault
	}
	if cfg.HistoryCap < 1 {
		return nil, fmt.Errorf("%w: history cap %d", ErrConfig, cfg.HistoryCap)
	}
	if cfg.Scripter == nil {
		cfg.Scripter = rdb
	}
	return &Store{
		rdb: rdb, scripter: cfg.Scripter, ks: ks, histCap: cfg.HistoryCap,
		begin:    lua.MustScript("checkpoint_begin"),
		advance:  lua.MustScript("checkpoint_advance"),
		progress: lua.MustScript("checkpoint_progress"),
	}, nil
}

// ValidateStages checks a run's stage list: 1..64 distinct names matching
// ^[a-z][a-z0-9_-]{0,63}$ (commas would break the stored list).
func ValidateStages(stages []string) error {
	if len(stages) == 0 || len(stages) > 64 {
		return fmt.Errorf("%w: want 1..64 stages, got %d", ErrConfig, len(stages))
	}
	seen := make(map[string]bool, len(stages))
	for _, s := range stages {
		if !validStage(s) {
			return fmt.Errorf("%w: stage name %q must match ^[a-z][a-z0-9_-]{0,63}$", ErrConfig, s)
		}
		if seen[s] {
			return fmt.Errorf("%w: duplicate stage %q", ErrConfig, s)
		}
		seen[s] = true
	}
	return nil
}

func validStage(s string) bool {
	if s == "" || len(s) > 64 || s[0] < 'a' || s[0] > 'z' {
		return false
	}
	for i := 1; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z') && !(c >= '0' && c <= '9') && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

// Begin hands key's run record to the holder of lease, for run runID with
// the given stages, and returns the checkpoint to continue from. A record of
// another run starts fresh; the same run keeps its completed stages and
// cursor, so Decide(cp) resumes it. Attempt is incremented. One round trip.
func (s *Store) Begin(ctx context.Context, lease leasing.Lease, runID string, stages []string) (*Checkpoint, error) {
	if err := ValidateStages(stages); err != nil {
		return nil, err
	}
	if runID == "" {
		return nil, fmt.Errorf("%w: empty run id", ErrConfig)
	}
	k := lease.Key
	p := s.ks.Partition(k)
	res, err := s.begin.Run(ctx, s.scripter,
		[]string{s.ks.Lease(k), s.ks.Task(k), s.ks.History(k), s.ks.Watch(p)},
		lease.Owner, lease.Token, runID, strings.Join(stages, ","), s.histCap, s.ks.Events(p),
		k.String(), k.Subject(), k.Scope()).Slice()
	if err != nil {
		return nil, fmt.Errorf("checkpoints: begin %s: %w", k, err)
	}
	if len(res) != 8 || res[0] != int64(1) {
		return nil, fmt.Errorf("checkpoints: begin %s token %d: %w", k, lease.Token, leasing.ErrNotHeld)
	}
	// Built from the script's reply: one round trip, and exactly what this
	// holder was handed.
	str := func(i int) string { v, _ := res[i].(string); return v }
	cp := &Checkpoint{RunID: runID, Stage: str(2), Owner: lease.Owner, Token: lease.Token,
		StartedAt: MillisTime(str(6)), UpdatedAt: MillisTime(LatestMillis(str(7), str(6)))}
	cp.Completed = int(res[1].(int64))
	cp.Attempt = int(res[4].(int64))
	if c := str(3); c != "" {
		cp.Cursor = []byte(c)
	}
	cp.Stages = strings.Split(str(5), ",")
	return cp, nil
}

// Advance marks stage done for the lease holder's run and returns the next
// stage ("" after the last). It fails with leasing.ErrNotHeld when the lease
// or the record moved on, and ErrStageMismatch when stage is not current.
func (s *Store) Advance(ctx context.Context, lease leasing.Lease, runID, stage string) (next string, err error) {
	k := lease.Key
	res, err := s.advance.Run(ctx, s.scripter,
		[]string{s.ks.Lease(k), s.ks.Task(k), s.ks.History(k), s.ks.Watch(s.ks.Partition(k))},
		lease.Owner, lease.Token, runID, stage, s.histCap, s.ks.Events(s.ks.Partition(k))).Slice()
	if err != nil {
		return "", fmt.Errorf("checkpoints: advance %s: %w", k, err)
	}
	switch {
	case len(res) == 2 && res[0] == int64(1):
		next, _ := res[1].(string)
		return next, nil
	case len(res) == 1 && res[0] == int64(-1):
		return "", fmt.Errorf("checkpoints: advance %s stage %q: %w", k, stage, ErrStageMismatch)
	default:
		return "", fmt.Errorf("checkpoints: advance %s token %d: %w", k, lease.Token, leasing.ErrNotHeld)
	}
}

// SaveProgress stores cursor as the progress inside the current stage.
func (s *Store) SaveProgress(ctx context.Context, lease leasing.Lease, runID string, cursor []byte) error {
	k := lease.Key
	n, err := s.progress.Run(ctx, s.scripter,
		[]string{s.ks.Lease(k), s.ks.Task(k), s.ks.History(k), s.ks.Watch(s.ks.Partition(k))},
		lease.Owner, lease.Token, runID, cursor, s.histCap, s.ks.Events(s.ks.Partition(k))).Int()
	if err != nil {
		return fmt.Errorf("checkpoints: progress %s: %w", k, err)
	}
	if n != 1 {
		return fmt.Errorf("checkpoints: progress %s token %d: %w", k, lease.Token, leasing.ErrNotHeld)
	}
	return nil
}

// Load reads key's checkpoint; ErrNotFound when there is no run record.
func (s *Store) Load(ctx context.Context, k taskkey.Key) (*Checkpoint, error) {
	vals, err := s.rdb.HMGet(ctx, s.ks.Task(k), recordFields...).Result()
	if err != nil {
		return nil, fmt.Errorf("checkpoints: load %s: %w", k, err)
	}
	return FromFields(vals)
}

var recordFields = []string{"runId", "stages", "done", "stage", "cursor", "attempt", "owner", "token", "startedAt", "updatedAt"}

// FromFields builds a Checkpoint from an HMGET of recordFields.
func FromFields(vals []any) (*Checkpoint, error) {
	str := func(i int) string { s, _ := vals[i].(string); return s }
	if str(0) == "" {
		return nil, ErrNotFound
	}
	cp := &Checkpoint{
		RunID:     str(0),
		Stage:     str(3),
		Owner:     str(6),
		StartedAt: MillisTime(str(8)),
		UpdatedAt: MillisTime(LatestMillis(str(9), str(8))),
	}
	if st := str(1); st != "" {
		cp.Stages = strings.Split(st, ",")
	}
	cp.Completed, _ = strconv.Atoi(str(2))
	if c := str(4); c != "" {
		cp.Cursor = []byte(c)
	}
	cp.Attempt, _ = strconv.Atoi(str(5))
	cp.Token, _ = strconv.ParseInt(str(7), 10, 64)
	return cp, nil
}

// LatestMillis is the latest of millisecond stamps ("" and unparsable ones
// ignored; "" when there is none). A run record's last change is the
// latest of its updatedAt, requestedAt, startedAt and finishedAt: the
// scripts write updatedAt only when no other stamp of the same write
// carries the time (a field written costs Redis more than this costs a
// reader).
func LatestMillis(stamps ...string) string {
	best, bestMs := "", int64(0)
	for _, s := range stamps {
		if s == "" {
			continue // absent: strconv's error would be an allocation per view
		}
		if ms, err := strconv.ParseInt(s, 10, 64); err == nil && ms > bestMs {
			best, bestMs = s, ms
		}
	}
	return best
}

// MillisTime parses a Redis-time millisecond stamp; "" gives the zero time.
func MillisTime(s string) time.Time {
	ms, err := strconv.ParseInt(s, 10, 64)
	if err != nil || ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms).UTC()
}
