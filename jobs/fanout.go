package jobs

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/tasklease/tasklease/taskkey"
)

// OutcomeDuplicate answers SubmitMany for a subject this occurrence
// already reached (a fan-out resumed after a crash or a Redis error):
// nothing was recorded, the subject's one request stands.
const OutcomeDuplicate Outcome = "duplicate"

// submitManyChunk bounds the subjects one script call submits, so a big
// batch never blocks Redis for long (about 30 µs of Redis time each).
const submitManyChunk = 128

// Occurrence names one firing of a cron schedule: SubmitMany with an
// Occurrence gives each subject exactly one request for it, however often
// the batch is retried.
type Occurrence struct {
	Schedule string    // the schedule's name
	At       time.Time // the occurrence's time (recorded in whole seconds)
}

// SubmitManyOptions qualify a SubmitMany batch. Zero values: source
// manual, the job's conflict policy, no occurrence.
type SubmitManyOptions struct {
	Source Source // why the requests are made (default SourceManual)
	Policy Policy // overrides the job's conflict policy when set
	// Occurrence, when set, makes the batch one cron occurrence's: each
	// subject gets one request for it however often the batch is sent
	// (see SubmitMany).
	Occurrence *Occurrence
}

// SubmitMany submits one request per subject of scope — what a cron
// fan-out or a bulk "sync everyone" does — with the same rules as Submit,
// in one script call per partition and at most submitManyChunk subjects,
// all pipelined in one round trip. It returns the outcomes in subject
// order; duplicates in subjects get one request (the repeats answer like
// a second request would, e.g. joined). Invalid input writes nothing.
//
// With opts.Occurrence each key records the occurrence, and a subject the
// same occurrence (or a later one of the schedule) already reached answers
// OutcomeDuplicate and writes nothing, so resuming an interrupted fan-out
// never sends a second request, and a deposed leader's late batch of an
// older occurrence is dropped.
func (r *Registry) SubmitMany(ctx context.Context, scope string, subjects []string, opts SubmitManyOptions) ([]Outcome, error) {
	job, ok := r.jobs[scope]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrUnknownScope, scope)
	}
	if opts.Source == "" {
		opts.Source = SourceManual
	}
	if _, err := ParseSource(string(opts.Source)); err != nil {
		return nil, err
	}
	if opts.Policy == "" {
		opts.Policy = job.OnConflict
	}
	if _, err := ParsePolicy(string(opts.Policy)); err != nil {
		return nil, err
	}
	occField, occ := "", ""
	if o := opts.Occurrence; o != nil {
		if o.Schedule == "" {
			return nil, fmt.Errorf("%w: occurrence without a schedule name", ErrConfig)
		}
		occField, occ = "occ:"+o.Schedule, strconv.FormatInt(o.At.Unix(), 10)
	}
	keys := make([]taskkey.Key, len(subjects))
	byPart := make(map[int][]int)
	for i, subj := range subjects {
		k, err := taskkey.New(subj, scope)
		if err != nil {
			return nil, err
		}
		keys[i] = k
		p := r.ks.Partition(k)
		byPart[p] = append(byPart[p], i)
	}
	// A debounced job delays what the fan-out starts, as it does any
	// request but a manual one (Job.Debounce).
	var timing []byte
	if job.Debounce > 0 && opts.Source != SourceManual {
		timing = appendTiming(nil, job.MinInterval.Milliseconds(), job.Debounce.Milliseconds(), job.DebounceMax.Milliseconds(), 0)
	} else {
		timing = appendTiming(nil, job.MinInterval.Milliseconds(), 0, 0, 0)
	}
	var calls []*scriptCall
	var idxs [][]int
	for p, idx := range byPart {
		for chunk := range slices.Chunk(idx, submitManyChunk) {
			c := &scriptCall{script: r.scripts.submitMany, keys: make([]string, 0, 8+2*len(chunk)), args: make([]any, 0, 12+2*len(chunk))}
			c.keys = append(c.keys, r.ks.QueueKeys(p)...)
			c.keys = append(c.keys, r.ks.Index(p), r.ks.Subjects(p, scope), r.ks.Retry(p), r.ks.Watch(p))
			c.args = append(c.args, scope, string(opts.Source), string(opts.Policy), r.stagesCSV[scope],
				job.Retry.MaxAttempts, string(timing), r.histCap, r.ks.Events(p), r.ks.Cancels(p),
				r.retention.Milliseconds(), occField, occ)
			for _, i := range chunk {
				c.keys = append(c.keys, r.ks.Task(keys[i]), r.ks.History(keys[i]))
				c.args = append(c.args, subjects[i], newRunID())
			}
			calls = append(calls, c)
			idxs = append(idxs, chunk)
		}
	}
	// One pipelined round trip for the whole batch.
	if err := evalGrouped(ctx, r.gc, calls); err != nil {
		return nil, fmt.Errorf("jobs: submit many %s: %w", scope, err)
	}
	out := make([]Outcome, len(subjects))
	for ci, c := range calls {
		res, err := c.cmd.Slice()
		if err != nil {
			return nil, fmt.Errorf("jobs: submit many %s: %w", scope, err)
		}
		for j, i := range idxs[ci] {
			if j < len(res) {
				out[i] = Outcome(replyString(res[j]))
			}
		}
	}
	for _, o := range out {
		if o != OutcomeDuplicate {
			r.metrics.requests.WithLabelValues(scope, string(opts.Source), string(o)).Inc()
		}
	}
	return out, nil
}

// ScanSubjects pages through partition p's subjects of scope (those
// requested by anything but a schedule within the retention): pass cursor
// 0 first, then the returned cursor until it is 0 again. A subject may be
// returned twice (the scan's guarantee is only "at least once"); fan-outs
// submit with an Occurrence, which makes that harmless.
func (r *Registry) ScanSubjects(ctx context.Context, scope string, p int, cursor uint64, count int64) ([]string, uint64, error) {
	if _, ok := r.jobs[scope]; !ok {
		return nil, 0, fmt.Errorf("%w: %q", ErrUnknownScope, scope)
	}
	if p < 0 || p >= r.ks.Partitions() {
		return nil, 0, fmt.Errorf("%w: partition %d out of range", ErrConfig, p)
	}
	flat, next, err := r.rdb.ZScan(ctx, r.ks.Subjects(p, scope), cursor, "", count).Result()
	if err != nil {
		return nil, 0, fmt.Errorf("jobs: scan subjects %s: %w", scope, err)
	}
	out := make([]string, 0, len(flat)/2)
	for i := 0; i < len(flat); i += 2 { // member, score pairs
		out = append(out, flat[i])
	}
	return out, next, nil
}

// Subjects returns every subject of scope that was requested, by anything
// but a schedule, within the retention, sorted. It loads them all: fan-outs
// over many subjects page with ScanSubjects instead.
func (r *Registry) Subjects(ctx context.Context, scope string) ([]string, error) {
	var out []string
	for p := range r.ks.Partitions() {
		cursor := uint64(0)
		for {
			page, next, err := r.ScanSubjects(ctx, scope, p, cursor, 1000)
			if err != nil {
				return nil, err
			}
			out = append(out, page...)
			if cursor = next; cursor == 0 {
				break
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// Partitions returns the partition count, for callers that page through
// partitions (ScanSubjects).
func (r *Registry) Partitions() int { return r.ks.Partitions() }
