package jobs

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/redistest"
)

// gatherLimiterSeries scrapes reg: the value of each tasklease_limiter_*
// series, by "<metric>/<label value>".
func gatherLimiterSeries(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		name := mf.GetName()
		for _, m := range mf.GetMetric() {
			var label string
			for _, l := range m.GetLabel() {
				if l.GetName() == "limiter" || l.GetName() == "scope" {
					label = l.GetValue()
				}
			}
			switch mf.GetType() {
			case dto.MetricType_GAUGE:
				out[name+"/"+label] = m.GetGauge().GetValue()
			case dto.MetricType_COUNTER:
				out[name+"/"+label] = m.GetCounter().GetValue()
			}
		}
	}
	return out
}

// The limiters' use and waiting runs are gauges read from Redis at scrape
// time, one series per limiter (the jobs' own too); the deferred counter
// is registered for the engine to count with.
func TestLimiterMetrics(t *testing.T) {
	m := redistest.StartMini(t)
	rdb := m.Client(t)
	preg := prometheus.NewRegistry()
	e := newEnv(t, rdb, Config{Prefix: "lm", Metrics: preg,
		Limiters: []Limiter{{Name: "remote_store", Concurrency: 50, Rate: Rate{Count: 20, Per: time.Second, Burst: 10}}},
		Jobs: []Job{
			{Scope: "course_sync", Limiters: []string{"remote_store"}, Concurrency: 3, Stages: []Stage{{Name: "a", Handler: &counter{}}}},
			{Scope: "backup", Stages: []Stage{{Name: "a", Handler: &counter{}}}},
		}})
	got := gatherLimiterSeries(t, preg)
	for _, k := range []string{"tasklease_limiter_in_use/remote_store", "tasklease_limiter_in_use/job.course_sync",
		"tasklease_limiter_waiting/remote_store", "tasklease_limiter_waiting/job.course_sync"} {
		if v, ok := got[k]; !ok || v != 0 {
			t.Errorf("%s = %v (present %v), want 0", k, v, ok)
		}
	}

	// Two slots held and one expired, three runs waiting (the hashes
	// Registry.Limiters reads).
	ctx := context.Background()
	key := e.reg.limiters["remote_store"].key
	live := float64(time.Now().Add(time.Minute).UnixMilli())
	gone := float64(time.Now().Add(-time.Minute).UnixMilli())
	if err := rdb.ZAdd(ctx, key+":slots", redis.Z{Score: live, Member: "r1"}, redis.Z{Score: live, Member: "r2"},
		redis.Z{Score: gone, Member: "r0"}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.HSet(ctx, key+":wmeta", "w1", "x", "w2", "x", "w3", "x").Err(); err != nil {
		t.Fatal(err)
	}
	got = gatherLimiterSeries(t, preg)
	if got["tasklease_limiter_in_use/remote_store"] != 2 || got["tasklease_limiter_waiting/remote_store"] != 3 ||
		got["tasklease_limiter_in_use/job.course_sync"] != 0 {
		t.Errorf("after 2 slots taken and 3 runs waiting: %v", got)
	}

	e.reg.metrics.limiterDeferred.WithLabelValues("course_sync").Inc()
	if got := gatherLimiterSeries(t, preg); got["tasklease_limiter_deferred_total/course_sync"] != 1 {
		t.Errorf("tasklease_limiter_deferred_total{scope=course_sync} after one deferral: %v", got)
	}
}

// A scrape that cannot read the limiters answers without their series
// (instead of failing the whole scrape).
func TestLimiterCollectorRedisDown(t *testing.T) {
	preg := prometheus.NewRegistry()
	preg.MustRegister(newLimiterCollector(func(context.Context) ([]LimiterView, error) {
		return nil, errors.New("redis down")
	}))
	if got := gatherLimiterSeries(t, preg); len(got) != 0 {
		t.Errorf("series without Redis: %v", got)
	}
}
