package jobs

import (
	"context"
	"testing"

	"github.com/tasklease/tasklease/internal/benchutil"
	"github.com/tasklease/tasklease/internal/keyspace"
)

// BenchmarkQueueScript: one client, queue requests on active runs — the
// first queues each key's follow-up (b.N ≤ 1000), later ones coalesce.
func BenchmarkQueueScript(b *testing.B) {
	srv := benchutil.Server(b)
	rdb := benchutil.Client(b, srv.Addr(), 4)
	reg := benchRegistry(b, rdb, keyspace.PartitionsDefault, nil)
	subs := subjects("u", 1000)
	submitAll(b, reg, subs, 16)
	ctx := context.Background()
	b.ReportAllocs()
	m := startMeter(b, srv, rdb)
	b.ResetTimer()
	for i := range b.N {
		if _, err := reg.Submit(ctx, subs[i%len(subs)], benchScope, SubmitOptions{Source: SourceSchedule, Policy: PolicyQueue}); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	m.report(b, benchutil.ScriptCommands...)
}
