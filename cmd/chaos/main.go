// Command chaos runs the chaos soak of tasklease (package internal/chaos)
// against a build of cmd/runner: several `runner serve` processes on a
// Redis topology it starts (one server, Sentinel or Cluster), under load,
// while it SIGKILLs runners (the cron leader mid-fan-out among them),
// SIGSTOPs them past their lease TTL, pauses Redis past it, breaks the
// network between one runner and Redis (latency, lost replies, lost
// commands, partitions, resets, bandwidth: toxiproxy in process), and
// restarts or fails over Redis; then it checks that no key is stuck, tokens
// never go backwards, no process an exec stage started survives, every
// subject gets exactly one request per cron occurrence, no two
// executions of a key overlap unless the older one was refused, and a
// limited job never has more than --limit writers accepted at once by its
// fencing downstream (the full list: docs/correctness.md).
//
// Usage, from the repository:
//
//	go run ./cmd/chaos [--duration 45s] [--runners 3] [--keys 200] [--topology single|sentinel|cluster]
//	                   [--limit 5] [--seed N] [--json] [--runner-bin PATH] [--keep-logs DIR]
//	                   [--net-faults all|none|KIND,...] [--clock-faults all|none]
//	                   [--runner-tags TAGS]
//
// It builds the runner into a temporary directory unless --runner-bin
// names one, and needs redis-server on PATH. Progress goes to stderr; the
// report (a table, or with --json one JSON object) to stdout, whose last
// line is then `chaos: topology=<t> runs=<n> faults=<n> violations=<n>`
// (with --json that line goes to stderr). The same --seed, --keys and
// --runners replay a run's random choices.
//
// Exit status: 0 no violation, 1 violations found, 2 the run could not be
// done (bad flags, redis-server missing, a setup failure, interrupted).
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/tasklease/tasklease/internal/chaos"
)

// Exit statuses.
const (
	exitOK         = 0
	exitViolations = 1
	exitFailed     = 2
)

// runnerPkg is the command under test, built with `go build`.
const runnerPkg = "github.com/tasklease/tasklease/cmd/runner"

const redisMissing = "chaos: redis-server not found on PATH (apt-get install redis-server)"

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run is the command; it returns the exit status.
func run(args []string, stdout, stderr io.Writer) (code int) {
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dur := fs.Duration("duration", 45*time.Second, "how long the chaos (load and faults) lasts; the run takes about a minute more")
	runners := fs.Int("runners", chaos.RunnersDefault, "runner processes at once")
	keys := fs.Int("keys", 200, "subjects of the bulk job (keys/2 runs live per partition per cron occurrence)")
	burst := fs.Int("exec-burst", chaos.ExecBurstDefault, "long exec stages made live at once a fifth into the run, before the runner holding most of them is SIGKILLed (negative: none)")
	limit := fs.Int("limit", chaos.LimitDefault, fmt.Sprintf("concurrency of the limiter the limited job holds a slot of (1 to %d): never more than this many of its executions may have writes accepted at once", chaos.LimitMax))
	topo := fs.String("topology", chaos.TopologyDefault, `Redis deployment under test: single (AOF everysec), sentinel (a primary, two replicas, three Sentinels) or cluster (3 masters + 3 replicas)`)
	seed := fs.Int64("seed", 0, "seed of the random choices (0: from the clock); the report says which to replay")
	asJSON := fs.Bool("json", false, "print the report as one JSON object")
	runnerBin := fs.String("runner-bin", "", "a built runner binary to test (default: go build "+runnerPkg+")")
	netFaults := fs.String("net-faults", "all", fmt.Sprintf("network faults between the runners and Redis, comma-separated: all, none, or of %s", strings.Join(chaos.NetFaultKinds(), ",")))
	clockFaults := fs.String("clock-faults", "all", "clock faults: all (every Redis fault brings up a node whose clock lags the one it replaces) or none")
	tags := fs.String("runner-tags", "", "build tags for the runner it builds (tasklease_failpoint_ignore_loss: a build that keeps working after it lost its lease; tasklease_failpoint_time_tokens: one whose tokens come from Redis TIME alone; the checks must catch both)")
	keepLogs := fs.String("keep-logs", "", "copy the runners' logs here (default: only for a run with violations, into $TMPDIR)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitFailed
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "chaos: unexpected arguments %q\n", fs.Args())
		fs.Usage()
		return exitFailed
	}
	if *runners < 1 || *keys < 1 {
		fmt.Fprintln(stderr, "chaos: --runners and --keys must be at least 1")
		return exitFailed
	}
	if *limit < 1 || *limit > chaos.LimitMax {
		fmt.Fprintf(stderr, "chaos: --limit must be 1 to %d\n", chaos.LimitMax)
		return exitFailed
	}
	if *clockFaults != "all" && *clockFaults != "none" {
		fmt.Fprintf(stderr, "chaos: --clock-faults %q: want all or none\n", *clockFaults)
		return exitFailed
	}
	nets, err := parseNetFaults(*netFaults)
	if err != nil {
		fmt.Fprintln(stderr, "chaos:", err)
		return exitFailed
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		fmt.Fprintln(stderr, redisMissing)
		return exitFailed
	}

	t := newRunT(stderr)
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		t.fail()
		t.runCleanups()
		switch p := r.(type) {
		case fatalPanic: // printed by Fatal
			code = exitFailed
		case skipPanic:
			if strings.Contains(p.msg, "redis-server") {
				fmt.Fprintln(stderr, redisMissing)
			} else {
				fmt.Fprintln(stderr, "chaos: cannot run:", p.msg)
			}
			code = exitFailed
		default:
			panic(r)
		}
	}()
	stopSignals := cleanUpOnSignal(t)
	defer stopSignals()

	bin := *runnerBin
	if bin == "" {
		bin = buildRunner(t, t.TempDir(), *tags)
	}
	if *seed == 0 {
		*seed = time.Now().UnixNano()
	}
	t.Logf("seed %d, chaos for %v with %d runners and %d bulk keys on %s Redis", *seed, *dur, *runners, *keys, *topo)
	rep, err := chaos.Run(t, chaos.Options{
		Duration: *dur, Runners: *runners, Keys: *keys, Seed: *seed, ExecBurst: *burst,
		RunnerBin: bin, Topology: *topo, KeepLogs: *keepLogs, Limit: *limit, NetFaults: nets, NoClockFaults: *clockFaults == "none",
	})
	t.runCleanups()
	if err != nil {
		fmt.Fprintln(stderr, err)
		return exitFailed
	}
	replay := fmt.Sprintf("go run ./cmd/chaos --seed %d --duration %v --runners %d --keys %d --exec-burst %d --limit %d --topology %s --net-faults %s --clock-faults %s",
		rep.Seed, *dur, rep.Runners, rep.Keys, *burst, rep.Limit, rep.Topology, *netFaults, *clockFaults)
	if *tags != "" {
		replay += " --runner-tags " + *tags
	}
	last := fmt.Sprintf("chaos: topology=%s runs=%d faults=%d violations=%d", rep.Topology, rep.Runs, rep.Faults, rep.Violations)
	if *asJSON {
		if err := json.NewEncoder(stdout).Encode(rep); err != nil {
			fmt.Fprintln(stderr, "chaos: report:", err)
			return exitFailed
		}
		fmt.Fprintln(stderr, last)
	} else {
		printReport(stdout, rep, replay)
		fmt.Fprintln(stdout, last)
	}
	if rep.Violations > 0 {
		return exitViolations
	}
	return exitOK
}

// cleanUpOnSignal runs t's cleanups and exits on the first SIGINT or
// SIGTERM (a second one kills at once: the runners and redis-server die
// with this process anyway). The returned func stops watching.
func cleanUpOnSignal(t *runT) (stop func()) {
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case s := <-sigc:
			signal.Stop(sigc)
			t.fail()
			t.Logf("%v: stopping everything the run started", s)
			t.runCleanups()
			// The run itself is still going on the main goroutine and
			// cannot be interrupted: exit from here.
			os.Exit(exitFailed)
		case <-done:
		}
	}()
	return func() { signal.Stop(sigc); close(done) }
}

// parseNetFaults reads --net-faults: nil for all, empty for none.
func parseNetFaults(v string) ([]string, error) {
	switch v {
	case "all":
		return nil, nil
	case "none":
		return []string{}, nil
	}
	var out []string
	for k := range strings.SplitSeq(v, ",") {
		k = strings.TrimSpace(k)
		if !slices.Contains(chaos.NetFaultKinds(), k) {
			return nil, fmt.Errorf("--net-faults: %q is not all, none or one of %s", k, strings.Join(chaos.NetFaultKinds(), ","))
		}
		out = append(out, k)
	}
	return out, nil
}

// buildRunner builds cmd/runner into dir with tags (the working directory must be in
// the tasklease module).
func buildRunner(t *runT, dir, tags string) string {
	bin := filepath.Join(dir, "runner")
	start := time.Now()
	out, err := exec.Command("go", "build", "-tags", tags, "-o", bin, runnerPkg).CombinedOutput()
	if err != nil {
		t.Fatalf("go build %s: %v\n%s(run from the tasklease repository, or pass --runner-bin PATH)", runnerPkg, err, out)
	}
	t.Logf("built %s in %v", bin, time.Since(start).Round(time.Millisecond))
	return bin
}

// printReport writes the human report: faults by kind, the figures, the
// violations.
func printReport(w io.Writer, rep chaos.Report, replay string) {
	fmt.Fprintf(w, "chaos: seed %d (replay: %s)\n\n", rep.Seed, replay)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "fault\tcount\t")
	for _, k := range chaos.FaultKinds() {
		fmt.Fprintf(tw, "%s\t%d\t\n", k, rep.FaultsByKind[k])
	}
	fmt.Fprintf(tw, "total\t%d\t\n", rep.Faults)
	_ = tw.Flush()
	fmt.Fprintln(w)
	for _, l := range rep.Summary() {
		fmt.Fprintln(w, "chaos:", l)
	}
	if rep.LogsDir != "" {
		fmt.Fprintln(w, "chaos: runner logs kept in", rep.LogsDir)
	}
	if rep.Violations == 0 {
		return
	}
	fmt.Fprintln(w)
	checks := make([]string, 0, len(rep.ViolationsByCheck))
	for c := range rep.ViolationsByCheck {
		checks = append(checks, c)
	}
	sort.Strings(checks)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "violated check\tviolations\t")
	for _, c := range checks {
		fmt.Fprintf(tw, "%s\t%d\t\n", c, rep.ViolationsByCheck[c])
	}
	_ = tw.Flush()
	for _, d := range rep.Details {
		fmt.Fprintf(w, "\n%s\n", d)
	}
	fmt.Fprintf(w, "\nchaos: %d violation(s); replay: %s\n", rep.Violations, replay)
}
