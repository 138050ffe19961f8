package jobs

import (
	"context"
	"fmt"
	"slices"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/taskkey"
)

// resumeBatch bounds the parked runs one resume.lua call re-queues, so
// resuming a scope with a large backlog never blocks Redis for long.
const resumeBatch = 500

// Pause pauses scope: requests are still accepted (and coalesced by key as
// always), but no runner claims a run of the scope until Resume; runs that
// are executing finish. The claim script checks the pause atomically, in
// the partition of each run; a run it meets is parked off the queue
// (TaskView.Waiting says so) and re-queued by Resume. Pausing a paused
// scope changes nothing.
func (r *Registry) Pause(ctx context.Context, scope string) error {
	if _, ok := r.jobs[scope]; !ok {
		return fmt.Errorf("%w: %q", ErrUnknownScope, scope)
	}
	// Partition 0 last: it is the copy PausedScopes reads, so a scope shown
	// paused is paused in every partition.
	pipe := r.rdb.Pipeline()
	for p := r.ks.Partitions() - 1; p >= 0; p-- {
		pipe.SAdd(ctx, r.ks.Paused(p), scope)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("jobs: pause %s: %w", scope, err)
	}
	return nil
}

// Resume resumes scope on every partition and re-queues the runs parked
// while it was paused, on the lane they were requested on. It returns how
// many runs were re-queued. Resuming a scope that is not paused re-queues
// nothing. After an error the scope may be resumed on some partitions
// only (and still shows paused): call Resume again.
func (r *Registry) Resume(ctx context.Context, scope string) (int, error) {
	if _, ok := r.jobs[scope]; !ok {
		return 0, fmt.Errorf("%w: %q", ErrUnknownScope, scope)
	}
	total := 0
	for p := r.ks.Partitions() - 1; p >= 0; p-- {
		n, err := r.resumePartition(ctx, p, scope)
		total += n
		if err != nil {
			return total, fmt.Errorf("jobs: resume %s: %w", scope, err)
		}
	}
	return total, nil
}

// resumePartition runs resume.lua on partition p until nothing of scope
// is parked there: the first call unpauses the partition, so no run is
// parked after it; only a read of the parked set made after that call
// settles that nothing is left — a claim may park a run between the first
// read and the first call.
func (r *Registry) resumePartition(ctx context.Context, p int, scope string) (int, error) {
	rng := &redis.ZRangeBy{Min: "[" + scope + " ", Max: "[" + scope + " \xff", Count: resumeBatch}
	total := 0
	for unpaused := false; ; unpaused = true {
		members, err := r.rdb.ZRangeByLex(ctx, r.ks.Parked(p), rng).Result()
		if err != nil {
			return total, err
		}
		if len(members) == 0 && unpaused {
			return total, nil
		}
		keys := append([]string{r.ks.Paused(p), r.ks.Parked(p)}, r.ks.QueueKeys(p)...)
		keys = append(keys, r.ks.Watch(p))
		args := []any{scope, r.ks.Events(p)}
		for _, m := range members {
			k, err := taskkey.New(m[len(scope)+1:], scope)
			if err != nil { // not written by claim.lua: drop it
				if err := r.rdb.ZRem(ctx, r.ks.Parked(p), m).Err(); err != nil {
					return total, err
				}
				continue
			}
			keys = append(keys, r.ks.Task(k))
			args = append(args, m)
		}
		n, err := r.scripts.resume.Run(ctx, r.gc, keys, args...).Int()
		if err != nil {
			return total, err
		}
		total += n
	}
}

// PausedScopes returns the paused scopes, sorted.
func (r *Registry) PausedScopes(ctx context.Context) ([]string, error) {
	scopes, err := r.rdb.SMembers(ctx, r.ks.Paused(0)).Result()
	if err != nil {
		return nil, fmt.Errorf("jobs: paused scopes: %w", err)
	}
	slices.Sort(scopes)
	return scopes, nil
}
