package jobs

import (
	"errors"
	"fmt"
	"time"

	"github.com/tasklease/tasklease/checkpoints"
	"github.com/tasklease/tasklease/internal/histories"
	"github.com/tasklease/tasklease/leasing"
)

// The history hooks (testHooks.history and historySent, nil unless a test
// or RunnerConfig.HistoryLog sets them: each costs a nil check) report what
// this runner saw of its writes, for porcupine.

// recordWrite reports a fenced write sent at sent that ended with err: a
// refusal by the fence is Refused, a failure to hear back is Unknown.
func (r *Runner) recordWrite(op histories.Op, err error, sent time.Time) {
	h := r.testHooks.history
	if h == nil {
		return
	}
	out := histories.OK
	switch {
	case err == nil:
	case errors.Is(err, leasing.ErrNotHeld) || errors.Is(err, checkpoints.ErrStageMismatch):
		out = histories.Refused
	default:
		out = histories.Unknown
	}
	h(op, out, sent, time.Now())
}

// finishOp is the history's operation of a finish.lua call, before its
// answer: the stage it completes, if any, counts as done.
func (r *Runner) finishOp(job *Job, key, runID string, token int64, completed string) histories.Op {
	op := histories.Op{Key: key, Kind: histories.Finish, Runner: r.owner, RunID: runID, Token: token}
	for i, st := range job.Stages {
		if st.Name == completed {
			op.Done = i + 1
		}
	}
	return op
}

// recordFinish reports the answer of a finish.lua call (outcome.go):
// {1, status} held, anything else not.
func (r *Runner) recordFinish(op histories.Op, result string, res []any, err error, sent time.Time) {
	if err != nil || len(res) < 2 {
		r.recordWrite(op, fmt.Errorf("finish: %w", err), sent)
		return
	}
	if res[0] != int64(1) {
		r.recordWrite(op, leasing.ErrNotHeld, sent)
		return
	}
	switch Status(fmt.Sprint(res[1])) {
	case StatusDone, StatusFailed, StatusCancelled:
		op.Ends = true
	case StatusQueued:
		op.Ends = result != resultHandback // a follow-up run started
	}
	r.recordWrite(op, nil, sent)
}
