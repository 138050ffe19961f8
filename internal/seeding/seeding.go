// Package seeding fills Redis with the state large measurements start
// from, the way the engine itself would leave it (key names from
// internal/keyspace), without running the engine to get there.
package seeding

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/keyspace"
	"github.com/tasklease/tasklease/taskkey"
)

// Subjects adds n subjects, named name(0) … name(n-1), to the subject sets
// of scope ("subjects: all"), each in its partition's set, as if people had
// just asked for them; pipelined in chunks. It checks the sets then hold n.
func Subjects(ctx context.Context, rdb redis.UniversalClient, ks *keyspace.Space, scope string, n int, name func(int) string) error {
	score := float64(time.Now().UnixMilli())
	const chunk = 20_000
	for i := 0; i < n; i += chunk {
		members := make([][]redis.Z, ks.Partitions())
		for j := i; j < min(i+chunk, n); j++ {
			k, err := taskkey.New(name(j), scope)
			if err != nil {
				return err
			}
			p := ks.Partition(k)
			members[p] = append(members[p], redis.Z{Score: score, Member: k.Subject()})
		}
		pipe := rdb.Pipeline()
		for p, m := range members {
			if len(m) > 0 {
				pipe.ZAdd(ctx, ks.Subjects(p, scope), m...)
			}
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return fmt.Errorf("seeding: %w", err)
		}
	}
	var seeded int64
	for p := range ks.Partitions() {
		seeded += rdb.ZCard(ctx, ks.Subjects(p, scope)).Val()
	}
	if seeded != int64(n) {
		return fmt.Errorf("seeding: the subject sets hold %d subjects, want %d", seeded, n)
	}
	return nil
}
