package leasing_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/leasing"
	"github.com/tasklease/tasklease/taskkey"
)

// Two pods want to run u42's course sync: the first gets the lease, the
// second learns who holds it. The holder keeps the lease alive while it
// works and releases it when done; the next grant's token is greater, so a
// downstream store can refuse the older holder's late writes.
func ExampleManager() {
	mr, _ := miniredis.Run() // any Redis: redis.NewUniversalClient(...) for a real one
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	ctx := context.Background()

	m, err := leasing.NewManager(rdb, leasing.Config{})
	if err != nil {
		panic(err)
	}
	key := taskkey.MustNew("u42", "course_sync")

	lease, err := m.Acquire(ctx, key, "pod-a", 15*time.Second)
	if err != nil {
		panic(err)
	}
	fmt.Println("pod-a holds", lease.Key, "token > 0:", lease.Token > 0)

	_, err = m.Acquire(ctx, key, "pod-b", 15*time.Second)
	var held *leasing.HeldError
	if errors.As(err, &held) {
		fmt.Println("pod-b: held by", held.Owner, "same token:", held.Token == lease.Token)
	}

	// Renew in the background while working; the keeper's context ends as
	// soon as the lease may be lost.
	keeper, err := m.Keep(ctx, lease, leasing.KeeperConfig{})
	if err != nil {
		panic(err)
	}
	fmt.Println("working, lease lost:", keeper.Context().Err() != nil)
	keeper.Stop()

	fmt.Println("release:", m.Release(ctx, lease))
	// A second release (or a renew) of the same grant is refused.
	fmt.Println("again:", errors.Is(m.Release(ctx, lease), leasing.ErrNotHeld))

	next, _ := m.Acquire(ctx, key, "pod-b", 15*time.Second)
	fmt.Println("pod-b holds", next.Key, "newer token:", next.Token > lease.Token)
	// Output:
	// pod-a holds u42|course_sync token > 0: true
	// pod-b: held by pod-a same token: true
	// working, lease lost: false
	// release: <nil>
	// again: true
	// pod-b holds u42|course_sync newer token: true
}
