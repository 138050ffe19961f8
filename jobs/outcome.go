package jobs

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/tasklease/tasklease/internal/histories"
	"github.com/tasklease/tasklease/internal/keyspace"
	"github.com/tasklease/tasklease/leasing"
)

// finish ends an attempt with finish.lua. With readNext (and unless the
// runner is stopping) the same script takes the next entry of the
// partition for the slot this run frees, people's lane first, and claims it
// when it is a run of the same job; the caller runs it (or claims it) with
// the same slot.
func (r *Runner) finish(job *Job, e entry, lease leasing.Lease, result, completed string, stageErr error, attempt int, readNext bool, log *slog.Logger) []nextEntry {
	p, runID, entryID := e.p, e.runID, e.id
	k := lease.Key
	ks := r.reg.ks
	errText := ""
	if stageErr != nil {
		errText = truncateErr(stageErr.Error(), 1000)
	}
	delay := time.Duration(0)
	switch result {
	case resultRetry:
		delay = jitter(backoff(job.Retry.Backoff, job.Retry.MaxBackoff, attempt))
	case resultDefer:
		if ra, ok := retryAfterOf(stageErr); ok && ra.Delay > 0 {
			delay = ra.Delay // what the remote asked for: no jitter
		} else {
			delay = jitter(backoff(job.Retry.Backoff, job.Retry.MaxBackoff, attempt))
		}
	}
	read, first := 0, keyspace.LanePeople
	if readNext && r.taking() {
		read = 1
		first, _ = r.readOrder(p)
	}
	// Finish must land even when the run's context was cancelled (cancel,
	// shutdown); it is bounded by the lease instead.
	ctx, cancel := context.WithTimeout(context.Background(), lease.TTL)
	defer cancel()
	// The script derives the run's lease and history and the partition's
	// keys from the record's name.
	fin := &scriptCall{script: r.reg.scripts.finish, keys: []string{ks.Task(k)},
		args: []any{r.finishConf[job.Scope], lease.Token, runID, result, completed, errText, delay.Milliseconds(),
			read, first.Letter(), entryID, r.grantFloor()}}
	if r.reg.tracer != nil {
		// the follow-up's id names its trace links; untraced, the script derives it
		followUp := newRunID()
		fin.keys = append(fin.keys, ks.FollowUpLinks(k), ks.Links(k, followUp))
		fin.args = append(fin.args, followUp)
	}
	sent := time.Now() // a claim of the entry taken counts its lease from here
	var op histories.Op
	if r.testHooks.history != nil {
		op = r.finishOp(job, k.String(), runID, lease.Token, completed)
		if r.historySent != nil {
			r.historySent(op, sent)
		}
	}
	res, err := evalOne(ctx, r.reg.gc, fin)
	if r.testHooks.history != nil {
		r.recordFinish(op, result, res, err, sent)
	}
	if err != nil || len(res) < 2 {
		log.Warn("finish failed; the run will be recovered when its lease expires", slog.Any("error", err))
		return nil
	}
	next := r.decodeNext(ctx, p, res[2:], sent)
	if res[0] != int64(1) {
		r.reg.metrics.leaseLosses.WithLabelValues(k.Scope()).Inc()
		log.Warn("lease lost before finish", slog.String("outcome", result))
		return next
	}
	status := fmt.Sprint(res[1])
	switch Status(status) {
	case StatusRetrying:
		r.reg.metrics.retries.WithLabelValues(k.Scope()).Inc()
	case StatusDone, StatusFailed, StatusCancelled:
		r.reg.metrics.runs.WithLabelValues(k.Scope(), status).Inc()
		r.countFinished(k.Scope(), status)
	case StatusQueued:
		// handed back, or a queued follow-up started
		if result != resultHandback {
			r.reg.metrics.runs.WithLabelValues(k.Scope(), result).Inc()
			r.countFinished(k.Scope(), result)
		}
	}
	lvl := slog.LevelInfo
	if stageErr != nil && result != resultCancelled {
		lvl = slog.LevelWarn
	}
	log.LogAttrs(context.Background(), lvl, "run finished", slog.String("outcome", result), slog.String("status", status), slog.String("error", errText))
	return next
}

// backoff returns base·2^(attempt-1), capped at max.
func backoff(base, max time.Duration, attempt int) time.Duration {
	d := base
	for i := 1; i < attempt && d < max; i++ {
		d *= 2
	}
	return min(d, max)
}

// jitter spreads d over [d/2, d) so retries of many keys do not align.
func jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2)
}

func truncateErr(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
