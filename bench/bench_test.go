package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"
)

// TestMain lets the test binary act as the fan-out's leader process: the
// fanout measurement re-executes os.Args[0], which here is this binary.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == fanoutChildFlag {
		os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// TestQuickSuite runs every measurement once at --quick sizes and checks
// that the counts held and the JSON carries every figure. It skips without
// redis-server on PATH, unless TASKLEASE_REQUIRE_REDIS=1.
func TestQuickSuite(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("TASKLEASE_REQUIRE_REDIS") == "1" {
			t.Fatalf("redis-server not on PATH and TASKLEASE_REQUIRE_REDIS=1: %v", err)
		}
		t.Skip("redis-server not on PATH (set TASKLEASE_REQUIRE_REDIS=1 to make this fatal)")
	}
	if testing.Short() {
		t.Skip("the quick suite takes ~40s; skipped with -short")
	}
	var stdout, stderr bytes.Buffer
	start := time.Now()
	code := run([]string{"--quick", "--json", "--reps", "1"}, &stdout, &stderr)
	t.Logf("quick suite took %s; progress:\n%s", time.Since(start).Round(time.Second), stderr.String())
	if code != 0 {
		t.Fatalf("exit status %d, want 0", code)
	}
	var got map[string]any
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatalf("output is not one JSON object: %v\n%s", err, stdout.String())
	}
	for _, k := range append(slices.Clone(requiredKeys), "fanout_leader_rss_mb", "asynq_manual_under_backlog_p99_ms",
		"asynq_pickup_p50_ms", "asynq_bytes_per_finished_key", "submit_hot_per_s", "asynq_submit_hot_per_s",
		"e2e_1stage_limited_per_s", "e2e_1stage_limited_baseline_per_s", "e2e_1stage_limited_redis_calls_per_run",
		"round_trips_per_1stage_limited_run", "limiter_fairness_p50_ms", "rate_most_in_1s",
		"idle_cmds_per_pod_1_pods", "asynq_idle_cmds_per_pod_10_pods", "idle_conns_per_pod_10_pods", "idle_redis_cpu_pct_10_pods",
		"pickup_p99_ms_100_pods", "e2e_1stage_100_pods_ratio", "takeover_s_10_of_100_killed", "load_saturation_per_s",
		"asynq_pickup_p99_ms_at_50pct", "pickup_p99_ms_at_90pct") {
		v, ok := got[k]
		if !ok {
			t.Errorf("JSON has no %q", k)
			continue
		}
		if f, ok := v.(float64); !ok || f <= 0 {
			t.Errorf("%s = %v, want a positive number", k, v)
		}
	}
	if bullmqAvailable() == nil || os.Getenv("TASKLEASE_REQUIRE_NODE") == "1" {
		for _, k := range []string{"e2e_1stage_vs_bullmq", "submit_hot_vs_bullmq", "pickup_p50_vs_bullmq",
			"bullmq_bytes_per_finished_key", "bullmq_remove_e2e_1stage_per_s", "bullmq_idle_conns_per_pod_1_pods"} {
			if f, ok := got[k].(float64); !ok || f <= 0 {
				t.Errorf("%s = %v, want a positive number (BullMQ's side ran)", k, got[k])
			}
		}
	}
	if errs, _ := got["errors"].([]any); len(errs) > 0 {
		t.Errorf("failed checks: %v", errs)
	}
	if ts, _ := got["targets"].([]any); len(ts) != len(targets) {
		t.Errorf("%d targets in the JSON, want %d", len(ts), len(targets))
	}
}
