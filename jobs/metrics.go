package jobs

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are tasklease's Prometheus collectors. A Registry and its Runners
// share one Metrics; pass a prometheus.Registerer in Config.Metrics to
// expose them.
type Metrics struct {
	requests      *prometheus.CounterVec   // scope, source, outcome
	runs          *prometheus.CounterVec   // scope, result
	stageDuration *prometheus.HistogramVec // scope, stage, result
	leaseGrants   *prometheus.CounterVec   // scope
	leaseLosses   *prometheus.CounterVec   // scope
	takeovers     *prometheus.CounterVec   // scope, mode
	retries       *prometheus.CounterVec   // scope
	active        prometheus.Gauge
	// limiterDeferred counts the starts of runs a limiter put off (its
	// slots all in use, its rate, a retry-after hold), by the run's scope:
	// the limiting engine increments it once per deferral.
	limiterDeferred *prometheus.CounterVec // scope
}

func newMetrics() *Metrics {
	return &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tasklease_requests_total", Help: "Submitted requests by scope, source and outcome.",
		}, []string{"scope", "source", "outcome"}),
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tasklease_runs_total", Help: "Finished runs by scope and result (done, failed, cancelled).",
		}, []string{"scope", "result"}),
		stageDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "tasklease_stage_duration_seconds", Help: "Stage execution time by scope, stage and result.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}, []string{"scope", "stage", "result"}),
		leaseGrants: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tasklease_lease_grants_total", Help: "Leases granted to this process.",
		}, []string{"scope"}),
		leaseLosses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tasklease_lease_losses_total", Help: "Leases this process lost while running a stage.",
		}, []string{"scope"}),
		takeovers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tasklease_lease_takeovers_total", Help: "Runs recovered from an expired lease, by recovery mode.",
		}, []string{"scope", "mode"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tasklease_retries_total", Help: "Failed attempts scheduled for retry.",
		}, []string{"scope"}),
		active: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tasklease_runs_active", Help: "Runs executing in this process.",
		}),
		limiterDeferred: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tasklease_limiter_deferred_total", Help: "Run starts a limiter put off (all its slots in use, its rate, a retry-after hold), by the run's scope.",
		}, []string{"scope"}),
	}
}

// limiterCollector reports every limiter's slots in use and waiting runs
// (tasklease_limiter_in_use, tasklease_limiter_waiting), read from Redis at
// scrape time (Registry.Limiters: one pipelined round trip for all of
// them, none when no limiter is configured). A scrape that cannot reach
// Redis reports no limiter series (tasklease_redis_up says why).
type limiterCollector struct {
	limiters func(context.Context) ([]LimiterView, error)
	inUse    *prometheus.Desc
	waiting  *prometheus.Desc
}

func newLimiterCollector(limiters func(context.Context) ([]LimiterView, error)) *limiterCollector {
	return &limiterCollector{limiters: limiters,
		inUse: prometheus.NewDesc("tasklease_limiter_in_use",
			"Slots of the limiter held now, across the fleet (a job's own limiter is job.<scope>).", []string{"limiter"}, nil),
		waiting: prometheus.NewDesc("tasklease_limiter_waiting",
			"Runs waiting for the limiter now, across the fleet.", []string{"limiter"}, nil),
	}
}

func (c *limiterCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.inUse
	ch <- c.waiting
}

func (c *limiterCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	ls, err := c.limiters(ctx)
	if err != nil {
		return
	}
	for _, l := range ls {
		ch <- prometheus.MustNewConstMetric(c.inUse, prometheus.GaugeValue, float64(l.InUse), l.Name)
		ch <- prometheus.MustNewConstMetric(c.waiting, prometheus.GaugeValue, float64(l.Waiting), l.Name)
	}
}

func (m *Metrics) register(reg prometheus.Registerer, depth func(context.Context) (int64, int64, error),
	limiters func(context.Context) ([]LimiterView, error)) error {
	streamDepth := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		// The label keeps its name from when the queues were streams.
		Name: "tasklease_queue_depth", Help: "Requests in the partition queues: both lanes and the entries taken by runners (queue=stream), and runs waiting in the retry queues (queue=retry).",
		ConstLabels: prometheus.Labels{"queue": "stream"},
	}, func() float64 { s, _, _ := depthNow(depth); return float64(s) })
	retryDepth := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "tasklease_queue_depth", Help: "Requests in the partition queues: both lanes and the entries taken by runners (queue=stream), and runs waiting in the retry queues (queue=retry).",
		ConstLabels: prometheus.Labels{"queue": "retry"},
	}, func() float64 { _, r, _ := depthNow(depth); return float64(r) })
	// Whether this process reaches Redis, as /readyz says: the alert a
	// scraper can evaluate without probing the pod itself.
	redisUp := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "tasklease_redis_up", Help: "1 when this process reached Redis at the last scrape, else 0.",
	}, func() float64 {
		if _, _, err := depthNow(depth); err != nil {
			return 0
		}
		return 1
	})
	for _, c := range []prometheus.Collector{m.requests, m.runs, m.stageDuration, m.leaseGrants,
		m.leaseLosses, m.takeovers, m.retries, m.active, streamDepth, retryDepth, redisUp,
		m.limiterDeferred, newLimiterCollector(limiters)} {
		if err := reg.Register(c); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return err
			}
		}
	}
	return nil
}

func depthNow(depth func(context.Context) (int64, int64, error)) (int64, int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return depth(ctx)
}
