package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// report collects the per-repetition values of every metric. A metric's
// key is its tasklease name ("pickup_p50_ms"); asynq's value of the same
// metric is "asynq_" + key.
type report struct {
	reps    int
	quick   bool
	sizes   sizes
	machine machine
	vals    map[string][]float64
	extra   map[string]any // non-numeric figures for the JSON (last repetition)
	ran     []string       // measurements run, in order
	errors  []string       // failed checks and measurements
	elapsed time.Duration
}

func newReport(reps int, quick bool, sz sizes) *report {
	return &report{reps: reps, quick: quick, sizes: sz, vals: map[string][]float64{}, extra: map[string]any{}}
}

func (r *report) add(key string, v float64) { r.vals[key] = append(r.vals[key], v) }

// add2 adds one repetition's tasklease and asynq values of a metric.
func (r *report) add2(key string, tl, as float64) {
	r.add(key, tl)
	r.add("asynq_"+key, as)
}

// add2b adds one repetition's tasklease and BullMQ values of a metric
// (BullMQ's as "bullmq_" + key).
func (r *report) add2b(key string, tl, bq float64) {
	r.add(key+"_bullmq_rep", tl) // tasklease's value of the same repetition, for the ratio
	r.add("bullmq_"+key, bq)
}

// median of key's repetitions; ok false when it has none.
func (r *report) median(key string) (float64, bool) {
	v := r.vals[key]
	if len(v) == 0 {
		return 0, false
	}
	return median(v), true
}

// ratios returns tasklease ÷ asynq per repetition of key.
func (r *report) ratios(key string) []float64 { return r.ratiosOf(key, "asynq_"+key) }

// ratiosOf returns tl ÷ as per repetition.
func (r *report) ratiosOf(tlKey, asKey string) []float64 {
	tl, as := r.vals[tlKey], r.vals[asKey]
	var out []float64
	for i := range min(len(tl), len(as)) {
		if as[i] != 0 {
			out = append(out, tl[i]/as[i])
		}
	}
	return out
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// percentile returns the nearest-rank p-th percentile of d (0 if empty).
func percentile(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	return s[min(max(rank, 1), len(s))-1]
}

// row is one line of the table.
type row struct {
	label    string
	key      string // tasklease metric
	asKey    string // asynq metric ("" = "asynq_" + key; "-" = none)
	decimals int
	goal     string // the target evaluated on this row, if any
}

func (w row) asynqKey() string {
	switch w.asKey {
	case "":
		return "asynq_" + w.key
	case "-":
		return ""
	}
	return w.asKey
}

func (r *report) rows() []row {
	sz := r.sizes
	out := []row{
		{label: fmt.Sprintf("submit_hot: requests/s (%d requests, %d keys)", sz.HotRequests, sz.HotKeys), key: "submit_hot_per_s", goal: "submit_hot_ratio"},
		{label: fmt.Sprintf("submit_new: requests/s (%d new keys)", sz.NewRequests), key: "submit_new_per_s", goal: "submit_new_ratio"},
		{label: "submit_hot: Redis CPU µs per request", key: "submit_hot_redis_cpu_us_per_req", decimals: 1},
		{label: "submit_hot: Redis instructions per request (--callgrind)", key: "submit_hot_redis_instructions_per_req"},
		{label: "submit_hot: bench process CPU µs per request", key: "submit_hot_bench_cpu_us_per_req", decimals: 1},
		{label: "submit_new: Redis CPU µs per request", key: "submit_new_redis_cpu_us_per_req", decimals: 1},
		{label: "submit_new: Redis instructions per request (--callgrind)", key: "submit_new_redis_instructions_per_req"},
		{label: "submit_new: bench process CPU µs per request", key: "submit_new_bench_cpu_us_per_req", decimals: 1},
		{label: fmt.Sprintf("e2e_1stage: runs/s (%d runs)", sz.E2ERuns), key: "e2e_1stage_per_s", goal: "e2e_1stage_ratio"},
		{label: fmt.Sprintf("e2e_2stage: runs/s (%d runs; asynq: 1 task each)", sz.E2ERuns), key: "e2e_2stage_per_s", goal: "e2e_2stage_ratio"},
		{label: "e2e_1stage: runs/s, asynq with its default TaskCheckInterval 1s", key: "e2e_1stage_per_s", asKey: "asynq_default_e2e_1stage_per_s"},
		{label: "pickup p50, ms (asynq: TaskCheckInterval 1s)", key: "pickup_p50_ms", decimals: 2, goal: "pickup_p50_ms"},
		{label: "pickup p99, ms (asynq: TaskCheckInterval 1s)", key: "pickup_p99_ms", decimals: 2, goal: "pickup_p99_ms"},
		{label: "pickup p50, ms (asynq: TaskCheckInterval 10ms)", key: "pickup_p50_ms", asKey: "asynq_fast_pickup_p50_ms", decimals: 2},
		{label: "pickup p99, ms (asynq: TaskCheckInterval 10ms)", key: "pickup_p99_ms", asKey: "asynq_fast_pickup_p99_ms", decimals: 2},
		{label: "bytes per finished key (after e2e_1stage)", key: "bytes_per_finished_key", goal: "bytes_per_finished_key"},
		{label: "Redis CPU µs per run (e2e_1stage)", key: "redis_cpu_us_per_run", decimals: 1, goal: "redis_cpu_us_per_run"},
		{label: "Redis instructions per run (e2e_1stage, --callgrind)", key: "redis_instructions_per_run"},
		{label: "Redis commands per run (e2e_1stage, script commands included)", key: "redis_calls_per_run", decimals: 1},
		{label: "client round trips per run (e2e_1stage)", key: "round_trips_per_1stage_run", decimals: 2},
		{label: "client round trips per run (e2e_2stage)", key: "round_trips_per_2stage_run", decimals: 2, goal: "round_trips_per_2stage_run"},
		{label: "Redis CPU µs per run (e2e_2stage)", key: "e2e_2stage_redis_cpu_us_per_run", decimals: 1},
		{label: "Redis instructions per run (e2e_2stage, --callgrind)", key: "e2e_2stage_redis_instructions_per_run"},
		{label: "bench process CPU µs per run (e2e_1stage)", key: "bench_cpu_us_per_run", decimals: 1},
		{label: fmt.Sprintf("fanout: seconds per 1M subjects (%d subjects)", sz.FanoutSubjects), key: "fanout_1m_s", asKey: "-", decimals: 1, goal: "fanout_1m_s"},
		{label: "fanout: leader peak RSS, MB", key: "fanout_leader_rss_mb", asKey: "-", decimals: 1},
		{label: fmt.Sprintf("manual under backlog p50, ms (%d queued)", sz.Backlog), key: "manual_under_backlog_p50_ms", decimals: 2},
		{label: fmt.Sprintf("manual under backlog p99, ms (%d queued)", sz.Backlog), key: "manual_under_backlog_p99_ms", decimals: 2, goal: "manual_under_backlog_p99_ms"},
		{label: fmt.Sprintf("e2e_1stage_limited: runs/s (%d runs, a named limiter of concurrency %d: never binds)", sz.E2ERuns, concurrency), key: "e2e_1stage_limited_per_s", asKey: "-"},
		{label: "e2e_1stage_limited: the same repetition's tasklease e2e_1stage, runs/s", key: "e2e_1stage_limited_baseline_per_s", asKey: "-"},
		{label: "e2e_1stage_limited ÷ tasklease e2e_1stage (per repetition)", key: "e2e_1stage_limited_ratio", asKey: "-", decimals: 2, goal: "e2e_1stage_limited_ratio"},
		{label: "Redis commands per run (e2e_1stage_limited, script commands included)", key: "e2e_1stage_limited_redis_calls_per_run", asKey: "-", decimals: 1},
		{label: "client round trips per run (e2e_1stage_limited)", key: "round_trips_per_1stage_limited_run", asKey: "-", decimals: 2},
		{label: "Redis CPU µs per run (e2e_1stage_limited)", key: "e2e_1stage_limited_redis_cpu_us_per_run", asKey: "-", decimals: 1},
		{label: fmt.Sprintf("limiter fair share p50, ms (tenant B's runs; %d of A's wait for concurrency %d)", sz.FairBacklog, fairConcurrency), key: "limiter_fairness_p50_ms", asKey: "-", decimals: 2},
		{label: fmt.Sprintf("limiter fair share p99, ms (tenant B's runs; %d of A's wait for concurrency %d)", sz.FairBacklog, fairConcurrency), key: "limiter_fairness_p99_ms", asKey: "-", decimals: 2, goal: "limiter_fairness_p99_ms"},
		{label: fmt.Sprintf("rate accuracy: starts ÷ configured (%d/s, burst %d, %d s saturated)", ratePerS, rateBurst, sz.RateSeconds), key: "rate_accuracy", asKey: "-", decimals: 3, goal: "rate_accuracy"},
	}
	for _, n := range idleFleets {
		sfx := fmt.Sprintf("_%d_pods", n)
		pods := fmt.Sprintf("%d idle pod", n)
		if n > 1 {
			pods += "s"
		}
		out = append(out,
			row{label: "idle: Redis commands/s per pod, " + pods, key: "idle_cmds_per_pod" + sfx, decimals: 1, goal: goalIf(n == 100, "idle_cmds_per_pod"+sfx)},
			row{label: "idle: Redis CPU, % of a core, " + pods, key: "idle_redis_cpu_pct" + sfx, decimals: 2, goal: goalIf(n == 100, "idle_redis_cpu_pct"+sfx)},
			row{label: "idle: connections per pod, " + pods, key: "idle_conns_per_pod" + sfx, decimals: 1, goal: goalIf(n == 1, "idle_conns_per_pod"+sfx)})
	}
	out = append(out,
		row{label: fmt.Sprintf("fleet: pick-up p50, ms, %d idle pods", fleetPods), key: "pickup_p50_ms_100_pods", asKey: "-", decimals: 2},
		row{label: fmt.Sprintf("fleet: pick-up p99, ms, %d idle pods", fleetPods), key: "pickup_p99_ms_100_pods", asKey: "-", decimals: 2, goal: "pickup_p99_ms_100_pods"},
		row{label: fmt.Sprintf("fleet: e2e_1stage runs/s, 1 pod of concurrency %d", fleetE2EConcurrency), key: "e2e_1stage_1_pod_per_s", asKey: "-"},
		row{label: fmt.Sprintf("fleet: e2e_1stage runs/s, %d pods of concurrency %d", fleetPods, fleetE2EConcurrency/fleetPods), key: "e2e_1stage_100_pods_per_s", asKey: "-"},
		row{label: fmt.Sprintf("fleet: %d pods ÷ 1 pod (per repetition)", fleetPods), key: "e2e_1stage_100_pods_ratio", asKey: "-", decimals: 2, goal: "e2e_1stage_100_pods_ratio"},
		row{label: fmt.Sprintf("fleet: takeover, s, %d of %d pods killed (lease TTL %s)", fleetKilled, fleetPods, fleetLeaseTTL), key: "takeover_s_10_of_100_killed", asKey: "-", decimals: 2, goal: "takeover_s_10_of_100_killed"},
		row{label: "load: saturation runs/s (e2e_1stage, measured first)", key: "load_saturation_per_s"},
	)
	bq := func(label, key string, decimals int, goal string) row {
		return row{label: "BullMQ " + bullmqVersion + ": " + label, key: key + "_bullmq_rep", asKey: "bullmq_" + key, decimals: decimals, goal: goal}
	}
	out = append(out,
		bq(fmt.Sprintf("submit_hot requests/s vs Queue.add with deduplication.id (%d requests, %d keys)", sz.HotRequests, sz.HotKeys), "submit_hot_per_s", 0, "submit_hot_vs_bullmq"),
		bq(fmt.Sprintf("e2e_1stage runs/s vs %d pre-loaded jobs, default retention", sz.E2ERuns), "e2e_1stage_per_s", 0, "e2e_1stage_vs_bullmq"),
		row{label: "BullMQ " + bullmqVersion + ": e2e_1stage runs/s vs pre-loaded jobs with removeOnComplete", key: "e2e_1stage_per_s_bullmq_rep", asKey: "bullmq_remove_e2e_1stage_per_s"},
		bq("bytes per finished key (BullMQ: default retention)", "bytes_per_finished_key", 0, ""),
		bq("idle pick-up p50, ms", "pickup_p50_ms", 2, "pickup_p50_vs_bullmq"),
		bq("idle pick-up p99, ms", "pickup_p99_ms", 2, ""),
	)
	for _, n := range idleFleets {
		sfx := fmt.Sprintf("_%d_pods", n)
		out = append(out,
			row{label: fmt.Sprintf("BullMQ %s: idle Redis commands/s per pod (worker), %d", bullmqVersion, n), key: "idle_cmds_per_pod" + sfx, asKey: "bullmq_idle_cmds_per_pod" + sfx, decimals: 1},
			row{label: fmt.Sprintf("BullMQ %s: idle connections per pod (worker), %d", bullmqVersion, n), key: "idle_conns_per_pod" + sfx, asKey: "bullmq_idle_conns_per_pod" + sfx, decimals: 1})
	}
	for _, pct := range loadFractions {
		sfx := fmt.Sprintf("_at_%dpct", pct)
		out = append(out,
			row{label: fmt.Sprintf("load: pick-up p50, ms, open loop at %d %% of saturation", pct), key: "pickup_p50_ms" + sfx, decimals: 2},
			row{label: fmt.Sprintf("load: pick-up p99, ms, open loop at %d %% of saturation", pct), key: "pickup_p99_ms" + sfx, decimals: 2, goal: "pickup_p99_ms" + sfx})
	}
	return out
}

// target is one goal on a tasklease figure.
type target struct {
	key   string
	op    string // ">=", "<="
	limit float64
	// also, when set, is a second condition: the rss of the fan-out, the
	// upper bound of the rate's accuracy.
	also *target
	// decimals > 0: the figure is compared rounded to this many decimals,
	// the goal's own precision (the rate's accuracy counts handler starts,
	// which follow their admissions by a moment: an exact limiter measures
	// a few starts more or less, 1.00 to 2 decimals, not 1.000).
	decimals int
}

var targets = []target{
	{key: "submit_hot_ratio", op: ">=", limit: 1.3},
	{key: "submit_new_ratio", op: ">=", limit: 1.0},
	{key: "e2e_1stage_ratio", op: ">=", limit: 1.5},
	{key: "e2e_2stage_ratio", op: ">=", limit: 1.2},
	{key: "pickup_p50_ms", op: "<=", limit: 1},
	{key: "pickup_p99_ms", op: "<=", limit: 5},
	{key: "bytes_per_finished_key", op: "<=", limit: 1536},
	{key: "redis_cpu_us_per_run", op: "<=", limit: 80},
	{key: "round_trips_per_2stage_run", op: "<=", limit: 4},
	{key: "fanout_1m_s", op: "<=", limit: 60, also: &target{key: "fanout_leader_rss_mb", op: "<", limit: 200}},
	{key: "manual_under_backlog_p99_ms", op: "<=", limit: 50},
	{key: "e2e_1stage_limited_ratio", op: ">=", limit: 0.8},
	{key: "limiter_fairness_p99_ms", op: "<=", limit: 50},
	{key: "rate_accuracy", op: ">=", limit: 0.95, decimals: 2, also: &target{key: "rate_accuracy", op: "<=", limit: 1.0, decimals: 2}},
	// issue 5/6: an idle fleet costs Redis next to nothing
	{key: "idle_cmds_per_pod_100_pods", op: "<=", limit: 2},
	{key: "idle_redis_cpu_pct_100_pods", op: "<=", limit: 2},
	{key: "idle_conns_per_pod_1_pods", op: "<=", limit: 4},
	{key: "pickup_p99_ms_100_pods", op: "<=", limit: 2},
	{key: "e2e_1stage_100_pods_ratio", op: ">=", limit: 0.9},
	{key: "takeover_s_10_of_100_killed", op: "<=", limit: (fleetLeaseTTL + time.Second).Seconds()},
	{key: "pickup_p99_ms_at_50pct", op: "<=", limit: 5},
	{key: "pickup_p99_ms_at_90pct", op: "<=", limit: 20},
	// BullMQ, the second peer
	{key: "e2e_1stage_vs_bullmq", op: ">=", limit: 1.3},
	{key: "submit_hot_vs_bullmq", op: ">=", limit: 2},
	{key: "pickup_p50_vs_bullmq", op: "<=", limit: 0.5},
}

// bullmqVersion is the BullMQ that bullmq/package-lock.json pins.
const bullmqVersion = "5.81.5"

// goalIf is key when cond holds, else no goal.
func goalIf(cond bool, key string) string {
	if cond {
		return key
	}
	return ""
}

func (t target) String() string {
	s := fmt.Sprintf("%s %s %g", t.key, t.op, t.limit)
	if t.also != nil {
		s += " and " + t.also.String()
	} else if t.decimals > 0 {
		s += fmt.Sprintf(" (to %d decimals)", t.decimals)
	}
	return s
}

// value returns a figure by JSON key: a ratio key is the median of the
// per-repetition ratios, anything else the median of the repetitions. A
// ratio measured as such (e2e_1stage_limited_ratio) is a figure like any
// other.
func (r *report) value(key string) (float64, bool) {
	if _, ok := r.vals[key]; ok {
		return r.median(key)
	}
	if base, ok := strings.CutSuffix(key, "_ratio"); ok {
		rs := r.ratios(base + "_per_s")
		if len(rs) == 0 {
			return 0, false
		}
		return median(rs), true
	}
	return r.median(key)
}

// met evaluates t; ok false when a figure is missing.
func (r *report) met(t target) (met, ok bool) {
	v, ok := r.value(t.key)
	if !ok {
		return false, false
	}
	if t.decimals > 0 {
		p := math.Pow10(t.decimals)
		v = math.Round(v*p) / p
	}
	switch t.op {
	case ">=":
		met = v >= t.limit
	case "<=":
		met = v <= t.limit
	case "<":
		met = v < t.limit
	}
	if t.also != nil {
		m2, ok2 := r.met(*t.also)
		return met && m2, ok2
	}
	return met, true
}

func targetFor(key string) *target {
	for i, t := range targets {
		if t.key == key {
			return &targets[i]
		}
	}
	return nil
}

func format(v float64, decimals int) string { return fmt.Sprintf("%.*f", decimals, v) }

// formatRatio shows two decimals, or three significant digits below 0.1.
func formatRatio(v float64) string {
	if v < 0.1 {
		return fmt.Sprintf("%.3g", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// writeTable prints the human report: a markdown table and the machine.
func (r *report) writeTable(w io.Writer) {
	m := r.machine
	sizes := "full sizes"
	if r.quick {
		sizes = "quick sizes (--quick: ~20x smaller)"
	}
	fmt.Fprintf(w, "\n## tasklease vs asynq %s — median of %d repetition(s), %s\n\n", m.Asynq, r.reps, sizes)
	fmt.Fprintf(w, "machine: %s, %d cores, %s/%s; redis %s; %s; go-redis %s; %d client goroutines, concurrency %d, %d partitions\n\n",
		m.CPU, m.Cores, runtime.GOOS, runtime.GOARCH, m.RedisVersion, m.Go, m.GoRedis, clients, concurrency, 16)
	fmt.Fprintln(w, "| measure | tasklease | asynq | ratio tl÷asynq (per rep) | target met? |")
	fmt.Fprintln(w, "|---|---:|---:|---|---|")
	for _, row := range r.rows() {
		tl, ok := r.median(row.key)
		if !ok {
			continue
		}
		asCell, ratioCell := "n/a", ""
		if ak := row.asynqKey(); ak != "" {
			if as, ok := r.median(ak); ok {
				asCell = format(as, row.decimals)
				if per := r.ratiosOf(row.key, ak); len(per) > 0 {
					parts := make([]string, len(per))
					for i, p := range per {
						parts[i] = formatRatio(p)
					}
					ratioCell = fmt.Sprintf("%s (%s)", formatRatio(median(per)), strings.Join(parts, ", "))
				}
			}
		}
		targetCell := ""
		if t := targetFor(row.goal); t != nil {
			if met, ok := r.met(*t); ok {
				targetCell = map[bool]string{true: "yes", false: "**NO**"}[met] + " (" + t.String() + ")"
			}
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s |\n", row.label, format(tl, row.decimals), asCell, ratioCell, targetCell)
	}
	fmt.Fprintln(w)
	if r.quick {
		fmt.Fprintf(w, "fanout_1m_s is extrapolated linearly from %d subjects.\n", r.sizes.FanoutSubjects)
	}
	metN, total := r.targetsMet()
	fmt.Fprintf(w, "targets met: %d of %d evaluated (%d defined)\n", metN, total, len(targets))
	for _, t := range targets {
		if met, ok := r.met(t); ok && !met {
			v, _ := r.value(t.key)
			fmt.Fprintf(w, "  not met: %s (got %.3g)\n", t, v)
		}
	}
	fmt.Fprintf(w, "measurements: %s; took %s\n", strings.Join(r.ran, ", "), r.elapsed.Round(time.Second))
	if len(r.errors) > 0 {
		fmt.Fprintf(w, "\n**%d CHECK(S) FAILED** — figures above are not trustworthy:\n", len(r.errors))
		for _, e := range r.errors {
			fmt.Fprintln(w, "- FAILED:", e)
		}
	}
}

func (r *report) targetsMet() (met, evaluated int) {
	for _, t := range targets {
		if m, ok := r.met(t); ok {
			evaluated++
			if m {
				met++
			}
		}
	}
	return met, evaluated
}

// requiredKeys are always present in the JSON (null when not measured).
var requiredKeys = []string{
	"submit_hot_ratio", "submit_new_ratio", "e2e_1stage_ratio", "e2e_2stage_ratio",
	"pickup_p50_ms", "pickup_p99_ms", "bytes_per_finished_key", "redis_cpu_us_per_run",
	"round_trips_per_2stage_run", "fanout_1m_s", "manual_under_backlog_p99_ms",
	"e2e_1stage_limited_ratio", "limiter_fairness_p99_ms", "rate_accuracy",
}

// writeJSON prints one JSON object: the required figures, the median of
// every other metric, per-repetition values and ratios, targets, the
// machine and the failed checks.
func (r *report) writeJSON(w io.Writer) error {
	out := map[string]any{}
	for _, k := range requiredKeys {
		if v, ok := r.value(k); ok {
			out[k] = v
		} else {
			out[k] = nil
		}
	}
	perRep := map[string]any{}
	for k, v := range r.vals {
		out[k] = median(v)
		perRep[k] = v
		if !strings.HasPrefix(k, "asynq_") {
			if rs := r.ratios(k); len(rs) > 0 {
				perRep[k+"_ratio"] = rs
				if _, ok := out[k+"_ratio"]; !ok {
					out[k+"_ratio"] = median(rs)
				}
			}
		}
	}
	// Names that read better: the per-s ratio keys are the required ones.
	for _, k := range []string{"submit_hot", "submit_new", "e2e_1stage", "e2e_2stage"} {
		delete(out, k+"_per_s_ratio")
		if rs, ok := perRep[k+"_per_s_ratio"]; ok {
			delete(perRep, k+"_per_s_ratio")
			perRep[k+"_ratio"] = rs
		}
	}
	if rs := r.ratiosOf("e2e_1stage_per_s", "asynq_default_e2e_1stage_per_s"); len(rs) > 0 {
		out["e2e_1stage_ratio_vs_asynq_default"] = median(rs)
		perRep["e2e_1stage_ratio_vs_asynq_default"] = rs
	}
	out["per_rep"] = perRep
	for k, v := range r.extra {
		out[k] = v
	}
	var ts []map[string]any
	for _, t := range targets {
		v, ok := r.value(t.key)
		met, evaluated := r.met(t)
		e := map[string]any{"target": t.String(), "key": t.key, "op": t.op, "limit": t.limit, "value": nil, "met": nil}
		if ok {
			e["value"] = v
		}
		if evaluated {
			e["met"] = met
		}
		ts = append(ts, e)
	}
	out["targets"] = ts
	met, evaluated := r.targetsMet()
	out["targets_met"], out["targets_evaluated"] = met, evaluated
	out["machine"] = r.machine
	out["reps"], out["quick"], out["sizes"] = r.reps, r.quick, r.sizes
	out["measurements"] = r.ran
	out["fanout_extrapolated"] = r.quick && slices.Contains(r.ran, "fanout")
	out["asynq_fast_task_check_interval_ms"] = ms(asynqFastCheck)
	out["elapsed_s"] = r.elapsed.Seconds()
	out["errors"] = append([]string{}, r.errors...)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// machine describes where the figures were taken.
type machine struct {
	CPU          string `json:"cpu"`
	Cores        int    `json:"cores"`
	OS           string `json:"os"`
	RedisVersion string `json:"redis_version"`
	Go           string `json:"go"`
	Asynq        string `json:"asynq"`
	GoRedis      string `json:"go_redis"`
}

func machineInfo(ctx context.Context, rdb redis.UniversalClient) (machine, error) {
	m := machine{Cores: runtime.NumCPU(), OS: runtime.GOOS + "/" + runtime.GOARCH, Go: runtime.Version(),
		CPU: cpuModel(), Asynq: "v0.26.0", GoRedis: "?"}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			switch d.Path {
			case "github.com/hibiken/asynq":
				m.Asynq = d.Version
			case "github.com/redis/go-redis/v9":
				m.GoRedis = d.Version
			}
		}
	}
	srv, err := info(ctx, rdb, "server")
	if err != nil {
		return m, err
	}
	m.RedisVersion = srv["redis_version"]
	return m, nil
}

func cpuModel() string {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return "unknown CPU"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
			return strings.TrimSpace(v)
		}
	}
	return "unknown CPU"
}
