package triggers

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/tasklease/tasklease/internal/wait"
	"github.com/tasklease/tasklease/jobs"
)

// batchResult is what became of one batch.
type batchResult int

const (
	batchRecorded batchResult = iota // submitted and recorded; more follow
	batchLast                        // the last batch: the fan-out is done
	batchFenced                      // refused: a newer term owns the state
	batchGone                        // the state expired
	batchCrashed                     // test hook: simulated crash after the submit
)

// runFanOut submits f's batches until the end, recording each one after
// its submit. Redis errors are retried with backoff while f's term still
// leads; it stops between batches when ctx ends or leadership is lost
// (the cursor is in Redis: whoever leads next resumes).
func (s *Scheduler) runFanOut(ctx context.Context, f *fanOut) Decision {
	bctx, cancel := batchContext(ctx)
	defer cancel()
	backoff := s.retryMin
	var failingSince time.Time // zero while batches succeed
	for {
		if ctx.Err() != nil {
			return s.endFanOut(f, DecisionInterrupted, "shutdown")
		}
		if !s.leadsIn(f.term) {
			return s.endFanOut(f, DecisionInterrupted, "leadership lost")
		}
		res, err := s.batch(bctx, f)
		if err != nil {
			if failingSince.IsZero() {
				failingSince = time.Now()
			} else if time.Since(failingSince) > stateTTL(f.e, f.at) {
				// Failing for as long as a fan-out may be resumed: stop
				// blocking the schedule. The state stays unfinished; the
				// next resume abandons it when it is too old.
				f.log.Error("schedule: fan-out batch kept failing; giving up", slog.Any("error", err))
				return s.endFanOut(f, DecisionError, "batches kept failing")
			}
			f.retries++
			f.log.Warn("schedule: fan-out batch failed; retrying", slog.Any("error", err),
				slog.Duration("retry_in", backoff), slog.Int("partition", f.pos.part), slog.Int("index", f.pos.index))
			if !wait.Sleep(ctx, backoff) {
				return s.endFanOut(f, DecisionInterrupted, "shutdown")
			}
			backoff = min(2*backoff, FanOutRetryMax)
			continue
		}
		backoff, failingSince = s.retryMin, time.Time{}
		switch res {
		case batchRecorded:
			continue
		case batchLast:
			if f.resumed {
				return s.endFanOut(f, DecisionResumed, "")
			}
			return s.endFanOut(f, DecisionFired, "")
		case batchFenced:
			return s.endFanOut(f, DecisionFenced, "a newer leadership term owns the fan-out")
		case batchGone:
			return s.endFanOut(f, DecisionError, "the fan-out state expired")
		default:
			return s.endFanOut(f, DecisionInterrupted, "simulated crash")
		}
	}
}

// batch submits the subjects at f's position and then records them,
// advancing the cursor (fenced by f's term). An error leaves the position
// where it was: the batch is sent again and the occurrence answers
// "duplicate" for the subjects it already reached.
func (s *Scheduler) batch(ctx context.Context, f *fanOut) (batchResult, error) {
	subjects, next, last, err := s.page(ctx, f)
	if err != nil {
		return 0, err
	}
	f.maxLen = max(f.maxLen, len(subjects))
	sub, dup := 0, 0
	if len(subjects) > 0 {
		outs, err := s.reg.SubmitMany(ctx, f.e.Scope, subjects, jobs.SubmitManyOptions{
			Source: jobs.SourceSchedule, Occurrence: &jobs.Occurrence{Schedule: f.e.Name, At: f.at}})
		if err != nil {
			return 0, err
		}
		for _, o := range outs {
			if o == jobs.OutcomeDuplicate {
				dup++
			} else {
				sub++
				f.outcomes[o]++
			}
		}
		f.submitted += sub
	}
	// A page re-sent because its record failed finds the subjects it
	// submitted before as duplicates: record them as submitted (f.carry),
	// so the counts stay exact.
	recSub, recDup := f.carry+sub, max(0, dup-f.carry)
	f.carry = recSub
	f.seq++
	if s.afterSubmit != nil && !s.afterSubmit(batchInfo{name: f.e.Name, at: f.at, n: len(subjects), seq: f.seq, owner: s.owner}) {
		return batchCrashed, nil
	}
	done := 0
	if last {
		done = 1
	}
	res, err := cronScripts().progress.Run(ctx, s.rdb, []string{s.stateKey(f.e.Name)}, f.term, f.at.Unix(),
		f.pos.part, strconv.FormatUint(f.pos.cursor, 10), f.pos.index,
		next.part, strconv.FormatUint(next.cursor, 10), next.index,
		recSub, recDup, done, stateTTL(f.e, f.at).Milliseconds()).Slice()
	if err != nil {
		return 0, err
	}
	r := replyStrings(res)
	switch r[0] {
	case "ok", "recorded": // recorded: an earlier attempt's write had landed, its reply was lost
		if r[0] == "ok" {
			f.dups += recDup
		}
		f.pos, f.carry = next, 0
		f.batches++
		if len(r) >= 3 {
			f.totalSubmitted, f.totalDups = int64(atoi(r[1])), int64(atoi(r[2]))
		}
		if last {
			return batchLast, nil
		}
		return batchRecorded, nil
	case "done": // our final write landed, its reply was lost
		return batchLast, nil
	case "fenced":
		return batchFenced, nil
	case "moved":
		f.log.Error("schedule: the fan-out cursor moved under this term; stopping", slog.Any("state", r[1:]))
		return batchFenced, nil
	case "gone":
		return batchGone, nil
	}
	return 0, fmt.Errorf("triggers: cron_progress answered %q", r)
}

// page returns the subjects at f's position, the position after them, and
// whether they are the last. "subjects: all" pages each partition's subject
// set with ZSCAN (COUNT batchSize; empty pages are skipped without a
// write); an explicit list is sliced. Either way a batch holds about
// batchSize subjects, whatever their total.
func (s *Scheduler) page(ctx context.Context, f *fanOut) (subjects []string, next position, last bool, err error) {
	if !f.e.AllSubjects {
		n := len(f.e.Subjects)
		from := min(f.pos.index, n)
		to := min(from+s.batchSize, n)
		return f.e.Subjects[from:to], position{index: to}, to >= n, nil
	}
	parts := s.reg.Partitions()
	pos := f.pos
	for pos.part < parts {
		page, cur, err := s.reg.ScanSubjects(ctx, f.e.Scope, pos.part, pos.cursor, int64(s.batchSize))
		if err != nil {
			return nil, position{}, false, err
		}
		if cur == 0 {
			pos = position{part: pos.part + 1}
		} else {
			pos.cursor = cur
		}
		if len(page) > 0 {
			return page, pos, pos.part >= parts, nil
		}
	}
	return nil, pos, true, nil
}

// endFanOut logs the end of f (counts only when non-zero) and reports d.
func (s *Scheduler) endFanOut(f *fanOut, d Decision, reason string) Decision {
	attrs := []any{slog.String("decision", string(d)), slog.String("source", string(jobs.SourceSchedule)),
		slog.Duration("duration", time.Since(f.start)), slog.Int("batches", f.batches)}
	if reason != "" {
		attrs = append(attrs, slog.String("reason", reason))
	}
	if f.submitted > 0 {
		attrs = append(attrs, slog.Int("submitted", f.submitted))
	}
	for _, o := range []jobs.Outcome{jobs.OutcomeStarted, jobs.OutcomeJoined, jobs.OutcomeQueued,
		jobs.OutcomeSkipped, jobs.OutcomeReplaced, jobs.OutcomeThrottled} {
		if n := f.outcomes[o]; n > 0 {
			attrs = append(attrs, slog.Int(string(o), n))
		}
	}
	if f.dups > 0 {
		attrs = append(attrs, slog.Int("duplicates", f.dups))
	}
	if f.retries > 0 {
		attrs = append(attrs, slog.Int("retries", f.retries))
	}
	if f.resumed && f.totalSubmitted > 0 {
		attrs = append(attrs, slog.Int64("occurrence_submitted", f.totalSubmitted))
	}
	switch d {
	case DecisionFired:
		f.log.Info("schedule fired", attrs...)
	case DecisionResumed:
		f.log.Info("schedule fan-out resumed and finished", attrs...)
	case DecisionError:
		f.log.Error("schedule fan-out stopped", attrs...)
	default:
		f.log.Warn("schedule fan-out stopped; whoever leads next resumes it", attrs...)
	}
	return s.report(f.e, f.at, d, f)
}

// batchContext returns the context a fan-out's batches run on: it outlives
// stop by FanOutShutdownGrace, so the batch in flight at shutdown finishes
// (submit and cursor write) instead of being cut in between.
func batchContext(stop context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(context.WithoutCancel(stop))
	unhook := context.AfterFunc(stop, func() {
		t := time.NewTimer(FanOutShutdownGrace)
		defer t.Stop()
		select {
		case <-t.C:
			cancel()
		case <-ctx.Done(): // the fan-out ended first
		}
	})
	return ctx, func() {
		unhook()
		cancel()
	}
}

// replyStrings renders a script's array reply as strings.
func replyStrings(res []any) []string {
	out := make([]string, len(res))
	for i, v := range res {
		switch v := v.(type) {
		case string:
			out[i] = v
		case int64:
			out[i] = strconv.FormatInt(v, 10)
		case nil:
		default:
			out[i] = fmt.Sprint(v)
		}
	}
	if len(out) == 0 {
		out = []string{""}
	}
	return out
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

func unixSeconds(s string) time.Time {
	n, _ := strconv.ParseInt(s, 10, 64)
	return time.Unix(n, 0).UTC()
}
