package checkpoints_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/checkpoints"
	"github.com/tasklease/tasklease/leasing"
	"github.com/tasklease/tasklease/taskkey"
)

// Decide turns a checkpoint into where the run continues.
func ExampleDecide() {
	stages := []string{"pulling", "merging", "pushing"}
	for _, cp := range []*checkpoints.Checkpoint{
		nil, // no record yet
		{Stages: stages},
		{Stages: stages, Completed: 1, Stage: "merging", Cursor: []byte("page=3")},
		{Stages: stages, Completed: 3},
	} {
		r := checkpoints.Decide(cp)
		fmt.Printf("%s at %d %q cursor %q\n", r.Mode, r.StageIndex, r.Stage, r.Cursor)
	}
	// Output:
	// restart at 0 "" cursor ""
	// restart at 0 "pulling" cursor ""
	// resume at 1 "merging" cursor "page=3"
	// skip at 3 "" cursor ""
}

// pod-a runs u42's sync, finishes "pulling", saves its progress in
// "merging" and crashes. Once its lease expires, pod-b takes the same run
// over and resumes it where pod-a left it; pod-a's late writes are refused.
func ExampleStore() {
	mr, _ := miniredis.Run() // any Redis: redis.NewUniversalClient(...) for a real one
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()

	leases, _ := leasing.NewManager(rdb, leasing.Config{})
	store, _ := checkpoints.NewStore(rdb, checkpoints.Config{}) // same Prefix and Partitions as the leases
	key := taskkey.MustNew("u42", "course_sync")
	stages := []string{"pulling", "merging", "pushing"}

	a, _ := leases.Acquire(ctx, key, "pod-a", 10*time.Second)
	cp, _ := store.Begin(ctx, a, "run-1", stages)
	fmt.Println("pod-a:", checkpoints.Decide(cp).Mode, "attempt", cp.Attempt)
	next, _ := store.Advance(ctx, a, "run-1", "pulling")
	_ = store.SaveProgress(ctx, a, "run-1", []byte("page=3"))
	fmt.Println("pod-a: pulling done, next", next)

	mr.FastForward(10 * time.Second) // pod-a crashed: its lease expires

	b, _ := leases.Acquire(ctx, key, "pod-b", 10*time.Second)
	cp, _ = store.Begin(ctx, b, "run-1", stages)
	r := checkpoints.Decide(cp)
	fmt.Printf("pod-b: %s at %s, cursor %s, attempt %d\n", r.Mode, r.Stage, r.Cursor, cp.Attempt)

	err := store.SaveProgress(ctx, a, "run-1", []byte("page=4"))
	fmt.Println("pod-a wakes up:", errors.Is(err, leasing.ErrNotHeld))
	// Output:
	// pod-a: restart attempt 1
	// pod-a: pulling done, next merging
	// pod-b: resume at merging, cursor page=3, attempt 2
	// pod-a wakes up: true
}
