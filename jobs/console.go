package jobs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/checkpoints"
	"github.com/tasklease/tasklease/taskkey"
)

// What the operator console reads: pages of the task table, per-scope
// figures and bulk cancel. All of it scans the partitions' task indexes
// (at most listScanMax keys each), reading three fields per record, so a
// console over tens of thousands of tasks costs a few pipelined reads, not
// a record each.

// ListSort orders List and ListPage.
type ListSort string

const (
	// ListSortUpdated: most recently updated first (the default).
	ListSortUpdated ListSort = "updated"
	// ListSortStarted: most recently started first; runs never started last.
	ListSortStarted ListSort = "started"
)

// ParseListSort parses "updated" (or "") and "started".
func ParseListSort(s string) (ListSort, error) {
	switch ListSort(s) {
	case "", ListSortUpdated:
		return ListSortUpdated, nil
	case ListSortStarted:
		return ListSortStarted, nil
	}
	return "", fmt.Errorf("%w: sort %q (want updated or started)", ErrConfig, s)
}

// TaskPage is one page of List.
type TaskPage struct {
	// Tasks are the page's tasks, in the requested sort order.
	Tasks []TaskView `json:"tasks"`
	// Total counts every task matching the filter (the page is Tasks).
	Total int `json:"total"`
	// Offset and Limit are the page's position as applied: the
	// ListOptions' after defaults and bounds.
	Offset int `json:"offset"`
	Limit  int `json:"limit"`
	// Truncated: a partition's index held more than listScanMax keys; the
	// oldest were not examined.
	Truncated bool `json:"truncated,omitempty"`
}

// indexed is one task of the index scan.
type indexed struct {
	key              taskkey.Key
	status           Status
	updated, started int64 // ms, 0 when unset
}

// scanFilter selects tasks in scanIndex.
type scanFilter struct {
	status        Status
	scope         string
	subjectPrefix string
}

func (f scanFilter) keyMatches(k taskkey.Key) bool {
	return (f.scope == "" || k.Scope() == f.scope) && strings.HasPrefix(k.Subject(), f.subjectPrefix)
}

// scanBatch bounds the records read per pipeline of scanIndex.
const scanBatch = 1000

// scanIndex returns every indexed task matching f whose record exists:
// scope and subject prefix are decided from the key, status after an HMGET
// of status and the record's stamps (its last change is the latest of them,
// checkpoints.LatestMillis).
func (r *Registry) scanIndex(ctx context.Context, f scanFilter) ([]indexed, bool, error) {
	pipe := r.rdb.Pipeline()
	ranges := make([]*redis.StringSliceCmd, r.ks.Partitions())
	for p := range ranges {
		ranges[p] = pipe.ZRevRange(ctx, r.ks.Index(p), 0, listScanMax) // one more: truncated?
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, false, fmt.Errorf("jobs: scan index: %w", err)
	}
	truncated := false
	var cands []taskkey.Key
	for _, c := range ranges {
		members := c.Val()
		if len(members) > listScanMax {
			truncated, members = true, members[:listScanMax]
		}
		for _, m := range members {
			if k, err := taskkey.Parse(m); err == nil && f.keyMatches(k) {
				cands = append(cands, k)
			}
		}
	}
	out := make([]indexed, 0, len(cands))
	for batch := range slices.Chunk(cands, scanBatch) {
		pipe := r.rdb.Pipeline()
		cmds := make([]*redis.SliceCmd, len(batch))
		for i, k := range batch {
			cmds[i] = pipe.HMGet(ctx, r.ks.Task(k), "status", "startedAt", "updatedAt", "requestedAt", "finishedAt")
		}
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return nil, false, fmt.Errorf("jobs: scan index: %w", err)
		}
		for i, c := range cmds {
			v := c.Val()
			st, _ := v[0].(string)
			if st == "" || (f.status != "" && Status(st) != f.status) {
				continue // expired by retention (the janitor prunes the index), or filtered out
			}
			str := func(j int) string { s, _ := v[j].(string); return s }
			updated := checkpoints.LatestMillis(str(1), str(2), str(3), str(4))
			out = append(out, indexed{key: batch[i], status: Status(st), updated: msOf(updated), started: msOf(v[1])})
		}
	}
	return out, truncated, nil
}

func msOf(v any) int64 {
	s, _ := v.(string)
	n, _ := strconv.ParseInt(s, 10, 64)
	return n
}

// ListPage returns one page of the tasks matching opts, in opts.Sort
// order, with the number of all matching tasks.
func (r *Registry) ListPage(ctx context.Context, opts ListOptions) (TaskPage, error) {
	if opts.Limit <= 0 {
		opts.Limit = ListLimitDefault
	}
	opts.Limit = min(opts.Limit, ListLimitMax)
	opts.Offset = max(opts.Offset, 0)
	sortBy, err := ParseListSort(string(opts.Sort))
	if err != nil {
		return TaskPage{}, err
	}
	if err := r.validateFilter(opts); err != nil {
		return TaskPage{}, err
	}
	page := TaskPage{Tasks: []TaskView{}, Offset: opts.Offset, Limit: opts.Limit}
	if opts.Scope != "" && opts.Subject != "" {
		v, err := r.Get(ctx, opts.Subject, opts.Scope)
		if errors.Is(err, ErrNotFound) || (err == nil && opts.Status != "" && v.Status != opts.Status) {
			return page, nil
		}
		if err != nil {
			return TaskPage{}, err
		}
		page.Total = 1
		if opts.Offset == 0 {
			page.Tasks = append(page.Tasks, v)
		}
		return page, nil
	}
	f := scanFilter{status: opts.Status, scope: opts.Scope, subjectPrefix: opts.SubjectPrefix}
	found, truncated, err := r.scanIndex(ctx, f)
	if err != nil {
		return TaskPage{}, err
	}
	if opts.Subject != "" {
		found = slices.DeleteFunc(found, func(t indexed) bool { return t.key.Subject() != opts.Subject })
	}
	by := func(t indexed) int64 { return t.updated }
	if sortBy == ListSortStarted {
		by = func(t indexed) int64 { return t.started }
	}
	slices.SortFunc(found, func(a, b indexed) int {
		return cmp.Or(cmp.Compare(by(b), by(a)), cmp.Compare(a.key.String(), b.key.String()))
	})
	page.Total, page.Truncated = len(found), truncated
	if opts.Offset >= len(found) {
		return page, nil
	}
	found = found[opts.Offset:min(len(found), opts.Offset+opts.Limit)]
	pipe := r.rdb.Pipeline()
	cmds := make([]*redis.MapStringStringCmd, len(found))
	for i, t := range found {
		cmds[i] = pipe.HGetAll(ctx, r.ks.Task(t.key))
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return TaskPage{}, fmt.Errorf("jobs: list: %w", err)
	}
	for _, c := range cmds {
		if len(c.Val()) > 0 {
			page.Tasks = append(page.Tasks, viewFromRecord(c.Val()))
		}
	}
	return page, nil
}

func (r *Registry) validateFilter(opts ListOptions) error {
	if opts.Status != "" {
		if _, err := ParseStatus(string(opts.Status)); err != nil {
			return err
		}
	}
	if opts.Scope != "" {
		if _, ok := r.jobs[opts.Scope]; !ok {
			return fmt.Errorf("%w: %q", ErrUnknownScope, opts.Scope)
		}
	}
	if opts.Subject != "" {
		if err := taskkey.ValidateSubject(opts.Subject); err != nil {
			return err
		}
	}
	if opts.SubjectPrefix != "" {
		// A prefix of a valid subject is a valid subject.
		if err := taskkey.ValidateSubject(opts.SubjectPrefix); err != nil {
			return fmt.Errorf("subject prefix: %w", err)
		}
	}
	return nil
}

// Overview is what GET /v1/scopes answers: per scope, and the queues.
type Overview struct {
	// Scopes has one summary per registered job, sorted by scope.
	Scopes []ScopeSummary `json:"scopes"`
	// Queue is the depth of the request and retry queues.
	Queue QueueDepths `json:"queue"`
	// CountsTruncated: a partition's index held more than listScanMax
	// keys; counts of older tasks are missing.
	CountsTruncated bool `json:"countsTruncated,omitempty"`
	// At is the Redis time the overview was taken.
	At time.Time `json:"at"`
}

// QueueDepths are the requests in the partition queues (both lanes and the
// entries runners took and have not finished) and in the retry queues.
type QueueDepths struct {
	Stream int64 `json:"stream"` // named when the queues were streams; kept for API clients
	// Retry counts the runs waiting in the retry queues for their next
	// attempt.
	Retry int64 `json:"retry"`
}

// ScopeSummary is one job as the console shows it.
type ScopeSummary struct {
	// Scope, Stages and Policy are the job's: its scope, its stage names
	// in order and its default conflict policy (Job.OnConflict).
	Scope  string   `json:"scope"`
	Stages []string `json:"stages"`
	Policy Policy   `json:"policy"`
	// Paused: the scope is paused (Registry.Pause); its runs are not
	// claimed until Resume.
	Paused bool `json:"paused"`
	// Counts by status of the tasks in the index (idle never appears;
	// queued includes runs parked by a pause).
	Counts map[Status]int `json:"counts"`
	// LastHour and Throughput count the runs finished done or failed, as
	// the runners of the last hour recorded them (FinishedCount).
	// Throughput has one entry per minute of the last ThroughputMinutes,
	// oldest first, the current minute last.
	LastHour   FinishedTotals `json:"lastHour"`
	Throughput []MinuteTotals `json:"throughput"`
}

// FinishedTotals counts finished runs.
type FinishedTotals struct {
	Done   int `json:"done"`   // runs that ended done
	Failed int `json:"failed"` // runs that ended failed
}

// MinuteTotals counts the runs finished in the minute starting at Minute.
type MinuteTotals struct {
	Minute time.Time `json:"minute"` // UTC, Redis time
	FinishedTotals
}

// ThroughputMinutes is the length of ScopeSummary.Throughput.
const ThroughputMinutes = 30

// Overview returns every scope's summary and the queue depths.
func (r *Registry) Overview(ctx context.Context) (Overview, error) {
	found, truncated, err := r.scanIndex(ctx, scanFilter{})
	if err != nil {
		return Overview{}, err
	}
	paused, err := r.PausedScopes(ctx)
	if err != nil {
		return Overview{}, err
	}
	runners, now, err := r.runnersAt(ctx)
	if err != nil {
		return Overview{}, err
	}
	stream, retry, err := r.QueueDepth(ctx)
	if err != nil {
		return Overview{}, err
	}
	ov := Overview{Scopes: make([]ScopeSummary, 0, len(r.scopes)), Queue: QueueDepths{Stream: stream, Retry: retry}, CountsTruncated: truncated, At: now.UTC()}
	byScope := make(map[string]*ScopeSummary, len(r.scopes))
	nowMin := now.Unix() / 60 * 60
	for _, scope := range r.scopes {
		j := r.jobs[scope]
		s := ScopeSummary{Scope: scope, Stages: j.StageNames(), Policy: j.OnConflict, Paused: slices.Contains(paused, scope),
			Counts:     map[Status]int{StatusQueued: 0, StatusRunning: 0, StatusRetrying: 0, StatusDone: 0, StatusFailed: 0, StatusCancelled: 0},
			Throughput: make([]MinuteTotals, ThroughputMinutes)}
		for i := range s.Throughput {
			s.Throughput[i].Minute = time.Unix(nowMin-int64(ThroughputMinutes-1-i)*60, 0).UTC()
		}
		ov.Scopes = append(ov.Scopes, s)
	}
	for i := range ov.Scopes {
		byScope[ov.Scopes[i].Scope] = &ov.Scopes[i]
	}
	for _, t := range found {
		if s := byScope[t.key.Scope()]; s != nil {
			s.Counts[t.status]++
		}
	}
	for _, rn := range runners {
		for _, c := range rn.Finished {
			s := byScope[c.Scope]
			if s == nil || c.Minute <= nowMin-statsMinutes*60 {
				continue
			}
			s.LastHour.Done += c.Done
			s.LastHour.Failed += c.Failed
			if i := ThroughputMinutes - 1 - int((nowMin-c.Minute)/60); i >= 0 && i < ThroughputMinutes {
				s.Throughput[i].Done += c.Done
				s.Throughput[i].Failed += c.Failed
			}
		}
	}
	return ov, nil
}

// CancelSummary is what CancelMatching did (or, dry, would do).
type CancelSummary struct {
	// Matched counts the active tasks (queued, running, retrying) matching.
	Matched int `json:"matched"`
	// Cancelling, Cancelled and NotRunning count the cancels by outcome
	// (CancelCancelling, CancelCancelled, CancelNotRunning); all 0 when dry.
	Cancelling int `json:"cancelling"`
	Cancelled  int `json:"cancelled"`
	NotRunning int `json:"notRunning"`
	// Truncated: a partition's index held more than listScanMax keys;
	// older tasks were not examined.
	Truncated bool `json:"truncated,omitempty"`
}

// cancelParallel bounds the cancels CancelMatching has in flight.
const cancelParallel = 8

// CancelMatching cancels every active run matching the filter of opts
// (Status, Scope, SubjectPrefix, Subject; Limit, Offset and Sort are
// ignored) — the console's "cancel all matching". With dryRun it only
// counts them. Each task goes through Cancel, so the outcome per task is
// the same as one by one; a run that ended between the scan and its cancel
// counts as NotRunning.
func (r *Registry) CancelMatching(ctx context.Context, opts ListOptions, dryRun bool) (CancelSummary, error) {
	if err := r.validateFilter(opts); err != nil {
		return CancelSummary{}, err
	}
	var sum CancelSummary
	if opts.Status != "" && !opts.Status.Active() {
		return sum, nil
	}
	found, truncated, err := r.scanIndex(ctx, scanFilter{status: opts.Status, scope: opts.Scope, subjectPrefix: opts.SubjectPrefix})
	if err != nil {
		return CancelSummary{}, err
	}
	found = slices.DeleteFunc(found, func(t indexed) bool {
		return !t.status.Active() || (opts.Subject != "" && t.key.Subject() != opts.Subject)
	})
	sum.Matched, sum.Truncated = len(found), truncated
	if dryRun {
		return sum, nil
	}
	var (
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
		sem   = make(chan struct{}, cancelParallel)
	)
	for _, t := range found {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			o, err := r.Cancel(ctx, t.key.Subject(), t.key.Scope())
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				first = cmp.Or(first, err)
			case o == CancelCancelling:
				sum.Cancelling++
			case o == CancelCancelled:
				sum.Cancelled++
			default:
				sum.NotRunning++
			}
		})
	}
	wg.Wait()
	return sum, first
}
