package jobs

import (
	"context"
	"fmt"
	"testing"

	"github.com/tasklease/tasklease/internal/benchutil"
	"github.com/tasklease/tasklease/internal/keyspace"
)

func BenchmarkZZDump(b *testing.B) {
	srv := benchutil.Server(b)
	rdb := benchutil.Client(b, srv.Addr(), 4)
	reg := benchRegistry(b, rdb, keyspace.PartitionsDefault, nil)
	rn, _ := NewRunner(reg, RunnerConfig{ID: "bench"})
	job := reg.jobs[benchScope]
	ctx := context.Background()
	dump := func(what string) {
		keys, _ := rdb.Keys(ctx, "*task*").Result()
		for _, k := range keys {
			t, _ := rdb.Type(ctx, k).Result()
			if t != "hash" { continue }
			f, _ := rdb.HKeys(ctx, k).Result()
			v, _ := rdb.HVals(ctx, k).Result()
			fmt.Println(what, k, len(f))
			for i := range f { fmt.Printf("   %s=%q\n", f[i], v[i]) }
			enc, _ := rdb.ObjectEncoding(ctx, k).Result()
			fmt.Println(" enc", enc)
		}
		all, _ := rdb.Keys(ctx, "*").Result()
		fmt.Println(" keys", all)
	}
	cs := pendingEntries(b, reg, rn, 1)
	dump("submitted")
	claimAll(b, rn, cs)
	dump("claimed")
	rn.finish(job, cs[0].e, cs[0].lease, resultDone, "store", nil, cs[0].c.attempt, false, rn.log)
	dump("finished")
}
