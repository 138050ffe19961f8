package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/tasklease/tasklease/jobs"
)

// bullmqDir holds the BullMQ side (peer.mjs, bullmq pinned in its
// package-lock.json), relative to bench/: `npm ci --prefix bench/bullmq`.
const bullmqDir = "bullmq"

// bullmq: BullMQ (Node, the package pinned in bullmq/package-lock.json)
// run by this bench as a child process on the same private Redis, beside
// tasklease in the same repetition:
//   - hot-key submits: tasklease's submit_hot against Queue.add with
//     deduplication.id = the key (50 concurrent callers, nothing consuming);
//   - end to end: tasklease's e2e_1stage against E2ERuns no-op jobs loaded
//     with addBulk and then run by one Worker of concurrency 50, from the
//     worker's start to the last completion (BullMQ's loading is not
//     counted), with its default retention (completed jobs kept) and with
//     removeOnComplete; bytes per finished job after the former;
//   - idle pick-up latency: add → processor start, sequential samples;
//   - idle load: 1, 10 and 100 idle Workers (commands/s and connections a
//     worker, Redis CPU), as the idle measurement's pods.
//
// Without node on PATH or the package installed it is skipped (an error
// with TASKLEASE_REQUIRE_NODE=1).
func (b *bench) bullmq(rep int) error {
	if err := bullmqAvailable(); err != nil {
		if os.Getenv("TASKLEASE_REQUIRE_NODE") == "1" {
			return err
		}
		b.progress("bullmq rep %d: skipped: %v", rep, err)
		return nil
	}
	sz := b.sz

	// Hot-key submits.
	keys, n := sz.HotKeys, sz.HotRequests
	tl, err := b.submitTasklease(n, func(i int) string { return "u" + strconv.Itoa(i%keys) }, func(i int) jobs.Source { return hotSources[(i/keys)%len(hotSources)] })
	if err != nil {
		return fmt.Errorf("tasklease submits: %w", err)
	}
	if err := b.reset(); err != nil {
		return err
	}
	var hot struct {
		PerS    float64 `json:"per_s"`
		Waiting int64   `json:"waiting"`
	}
	if err := b.runPeer(context.Background(), "submit_hot", map[string]any{"requests": n, "keys": keys, "clients": clients}, &hot); err != nil {
		return err
	}
	b.check(fmt.Sprintf("bullmq rep %d: jobs waiting after the hot-key submits", rep), hot.Waiting, int64(keys))
	b.rep.add2b("submit_hot_per_s", tl.rate, hot.PerS)
	b.rep.add("submit_hot_vs_bullmq", tl.rate/hot.PerS)

	// End to end.
	e2e, err := b.e2eTasklease("bullmq e2e_1stage", rep, tlVariant{stages: 1, withBytes: true})
	if err != nil {
		return fmt.Errorf("tasklease end to end: %w", err)
	}
	type e2eOut struct {
		PerS      float64 `json:"per_s"`
		LoadPerS  float64 `json:"load_per_s"`
		Completed int64   `json:"completed"`
	}
	var kept, removed e2eOut
	if err := b.reset(); err != nil {
		return err
	}
	if err := b.runPeer(context.Background(), "e2e", map[string]any{"jobs": sz.E2ERuns, "concurrency": concurrency, "removeOnComplete": false}, &kept); err != nil {
		return err
	}
	b.check(fmt.Sprintf("bullmq rep %d: jobs completed (default retention)", rep), kept.Completed, int64(sz.E2ERuns))
	bytes, _, err := memoryOfAllKeys(b.ctx, b.admin)
	if err != nil {
		return err
	}
	if err := b.reset(); err != nil {
		return err
	}
	if err := b.runPeer(context.Background(), "e2e", map[string]any{"jobs": sz.E2ERuns, "concurrency": concurrency, "removeOnComplete": true}, &removed); err != nil {
		return err
	}
	b.check(fmt.Sprintf("bullmq rep %d: jobs completed (removeOnComplete)", rep), removed.Completed, int64(sz.E2ERuns))
	b.rep.add2b("e2e_1stage_per_s", e2e.rate, kept.PerS)
	b.rep.add("bullmq_remove_e2e_1stage_per_s", removed.PerS)
	b.rep.add("e2e_1stage_vs_bullmq", e2e.rate/kept.PerS)
	b.rep.add2b("bytes_per_finished_key", e2e.bytesPerKey, float64(bytes)/float64(sz.E2ERuns))

	// Idle pick-up.
	lat, err := b.pickupTasklease(sz.PickupSamples)
	if err != nil {
		return fmt.Errorf("tasklease pick-up: %w", err)
	}
	if err := b.reset(); err != nil {
		return err
	}
	var pk struct {
		Latencies []float64 `json:"latencies_ms"`
	}
	if err := b.runPeer(context.Background(), "pickup", map[string]any{"samples": sz.PickupSamples}, &pk); err != nil {
		return err
	}
	bqLat := make([]time.Duration, len(pk.Latencies))
	for i, l := range pk.Latencies {
		bqLat[i] = time.Duration(l * float64(time.Millisecond))
	}
	b.rep.add2b("pickup_p50_ms", ms(percentile(lat, 50)), ms(percentile(bqLat, 50)))
	b.rep.add2b("pickup_p99_ms", ms(percentile(lat, 99)), ms(percentile(bqLat, 99)))
	b.rep.add("pickup_p50_vs_bullmq", ms(percentile(lat, 50))/ms(percentile(bqLat, 50)))

	// Idle load: BullMQ's workers only (tasklease's pods are the idle
	// measurement's).
	window, settle := 10*time.Second, idleSettle
	fleets := idleFleets
	if b.rep.quick {
		window, settle, fleets = 2*time.Second, time.Second, idleFleets[:2]
	}
	idle := map[int]idleFigures{}
	for _, w := range fleets {
		f, err := b.idleBullmq(w, settle, window)
		if err != nil {
			return fmt.Errorf("bullmq, %d idle workers: %w", w, err)
		}
		idle[w] = f
		sfx := "_" + strconv.Itoa(w) + "_pods"
		b.rep.add("bullmq_idle_cmds_per_pod"+sfx, f.cmdsPerPod)
		b.rep.add("bullmq_idle_redis_cpu_pct"+sfx, f.cpuPct)
		b.rep.add("bullmq_idle_conns_per_pod"+sfx, f.connsPerPod)
	}
	b.progress("bullmq rep %d: hot-key submits tasklease %.0f/s, BullMQ %.0f/s (%.2f); end to end tasklease %.0f/s, BullMQ %.0f/s kept (%.2f), %.0f/s removeOnComplete (loading %.0f/s, not counted); bytes per finished key %.0f vs %.0f; pick-up p50 %.2f vs %.2f ms, p99 %.2f vs %.2f ms; idle BullMQ worker %.1f commands/s, %.1f connections",
		rep, tl.rate, hot.PerS, tl.rate/hot.PerS, e2e.rate, kept.PerS, e2e.rate/kept.PerS, removed.PerS, kept.LoadPerS,
		e2e.bytesPerKey, float64(bytes)/float64(sz.E2ERuns), ms(percentile(lat, 50)), ms(percentile(bqLat, 50)),
		ms(percentile(lat, 99)), ms(percentile(bqLat, 99)), idle[1].cmdsPerPod, idle[1].connsPerPod)
	return nil
}

// bullmqAvailable says why the BullMQ side cannot run, if it cannot.
func bullmqAvailable() error {
	if _, err := exec.LookPath("node"); err != nil {
		return fmt.Errorf("node not on PATH: %w", err)
	}
	if _, err := os.Stat(filepath.Join(bullmqDir, "node_modules", "bullmq", "package.json")); err != nil {
		return fmt.Errorf("bullmq not installed (npm ci --prefix bench/%s): %w", bullmqDir, err)
	}
	return nil
}

// runPeer runs one workload of peer.mjs to its end and decodes its JSON.
func (b *bench) runPeer(ctx context.Context, workload string, args map[string]any, out any) error {
	ctx, cancel := context.WithTimeout(ctx, e2eTimeout)
	defer cancel()
	cmd, stdout, err := b.peerCommand(ctx, workload, args)
	if err != nil {
		return err
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	raw, err := io.ReadAll(stdout)
	if werr := cmd.Wait(); werr != nil || err != nil {
		return fmt.Errorf("bullmq %s: %w: %s", workload, errors.Join(werr, err), stderr.String())
	}
	if err := json.Unmarshal(bytes.TrimSpace(raw), out); err != nil {
		return fmt.Errorf("bullmq %s: %w in %q", workload, err, raw)
	}
	return nil
}

func (b *bench) peerCommand(ctx context.Context, workload string, args map[string]any) (*exec.Cmd, io.ReadCloser, error) {
	args["addr"] = b.addr
	js, err := json.Marshal(args)
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.CommandContext(ctx, "node", filepath.Join(bullmqDir, "peer.mjs"), workload, string(js))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, fmt.Errorf("bullmq %s: %w", workload, err)
	}
	return cmd, stdout, nil
}

// idleBullmq measures n idle BullMQ Workers (one Node process, each
// Worker with connections of its own) as idleFleet measures pods.
func (b *bench) idleBullmq(n int, settle, window time.Duration) (idleFigures, error) {
	if err := b.reset(); err != nil {
		return idleFigures{}, err
	}
	ctx, cancel := context.WithTimeout(b.ctx, 2*time.Minute+window)
	defer cancel()
	args := map[string]any{"workers": n, "addr": b.addr}
	js, _ := json.Marshal(args)
	cmd := exec.CommandContext(ctx, "node", filepath.Join(bullmqDir, "peer.mjs"), "idle", string(js))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return idleFigures{}, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return idleFigures{}, err
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return idleFigures{}, err
	}
	defer func() { _ = stdin.Close(); _ = cmd.Wait() }()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		return idleFigures{}, fmt.Errorf("waiting for the workers: %w: %s", err, stderr.String())
	}
	var ready struct{ Ready bool }
	if json.Unmarshal([]byte(line), &ready) != nil || !ready.Ready {
		return idleFigures{}, fmt.Errorf("workers not ready: %q", line)
	}
	return b.idleWindow(n, settle, window, "") // BullMQ names its connections itself
}
