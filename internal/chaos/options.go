package chaos

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"
)

// Defaults and bounds of Options.
const (
	// DurationDefault is the chaos phase of a run without Duration, the soak
	// `go test ./cmd/runner` runs. A longer run is a long one: Redis restarts
	// at half time instead of at 40 %, the drain may take 90 s instead of
	// 45 s, and past 5 minutes the schedule fires every 2 s instead of every
	// second (which keeps a key's history within the history cap).
	DurationDefault = 30 * time.Second

	// DurationMin leaves the fault schedule room: the first cron leader
	// kill comes 3 s in, the Redis restart at 40 % of the duration.
	DurationMin = 10 * time.Second

	// RunnersDefault is how many runner processes run at once.
	RunnersDefault = 3

	// RunnersMax bounds Runners: runner ids are chaos-a … chaos-z.
	RunnersMax = 26

	// KeysDefault is the bulk job's subjects: with 2 partitions, each cron
	// occurrence makes ~200 runs live per partition.
	KeysDefault = 400

	// ExecBurstDefault is the exec stages of the burst (see
	// Options.ExecBurst): with three runners, about 150 on the one killed.
	ExecBurstDefault = 450

	// TopologyDefault is one redis-server.
	TopologyDefault = TopologySingle

	// LimitDefault is the concurrency of the limiter the limited job uses
	// (Options.Limit).
	LimitDefault = 5

	// ClockLagMin and ClockLagMax bound how far the clock of the node a
	// Redis fault brings up lags the clock of the node it replaces: more
	// than the time since the last grant (the load grants every few
	// milliseconds), and little enough that the leases the new node
	// extends by as much still end within the drain.
	ClockLagMin = 3 * time.Second
	ClockLagMax = 8 * time.Second

	// LimitMax bounds Limit: the limited job has limitedN subjects, and a
	// limit that its runs cannot reach checks nothing.
	LimitMax = limitedN / 2
)

// limitedN is the number of subjects of the limited job.
const limitedN = 32

// Options configures Run. The zero value of every field but RunnerBin
// takes its default.
type Options struct {
	// Duration is the chaos phase (load and faults); seeding the subjects
	// before it and the deploy, drain and checks after it add about a
	// minute. Default DurationDefault, at least DurationMin; longer than
	// DurationDefault is a long run (see DurationDefault).
	Duration time.Duration

	// Runners is how many `runner serve` processes run at once (a killed
	// one is started again). Default RunnersDefault, at most RunnersMax.
	Runners int

	// Keys is the number of subjects of the bulk job, the one every cron
	// occurrence fans out to: Keys/2 runs per partition go live at once.
	// Default KeysDefault.
	Keys int

	// ExecBurst is how many long exec stages (the burst job's, 5 s each,
	// each leaving a daemon) are made live at once, a fifth into the run;
	// the runner holding most of them is then SIGKILLed, and its stages'
	// processes must be gone within 5 s while the others keep their
	// leases. Default ExecBurstDefault; negative: no burst.
	ExecBurst int

	// Limit is the concurrency of the fleet-wide limiter "remote" that the
	// limited job uses: at no instant may more than Limit of its
	// executions have writes accepted by their fencing downstream (check
	// 9). Default LimitDefault, at most LimitMax.
	Limit int

	// Seed drives every random choice: the fault schedule, the load, the
	// recorder's hold times. A run with the same Seed, Keys and Runners
	// makes the same choices (the timing of the system under test is its
	// own). 0 picks one from the clock; Report.Seed says which.
	Seed int64

	// RunnerBin is the path of a built `runner` binary (cmd/runner), the
	// build under test. Required.
	RunnerBin string

	// Topology is the Redis deployment the runners use: TopologySingle,
	// TopologySentinel or TopologyCluster (see topology.go for the Redis
	// faults of each). Default TopologyDefault.
	Topology string

	// Logf receives progress lines: the faults as they happen, the epochs
	// as they are checked. Default: t.Logf.
	Logf func(format string, args ...any)

	// NetFaults are the network faults of the run (NetFaultKinds), one at
	// a time, on one runner at a time, every 1.5–4 s. Nil: all of them;
	// empty (not nil): none, and the runners connect to Redis directly.
	NetFaults []string

	// NoClockFaults turns the clock faults off: by default every Redis
	// fault brings up a node whose clock lags the one it replaces by
	// ClockLagMin..ClockLagMax (see topology.go), so a token made from
	// Redis TIME alone would go below one already issued (check 2).
	NoClockFaults bool

	// KeepLogs, when set, is a directory the runners' logs and the exec
	// stage's log are copied to at the end of the run. Without it they are
	// kept only when the run found a violation or failed, in
	// $TMPDIR/tasklease-chaos-e2e-<seed>.
	KeepLogs string
}

// withDefaults fills in the zero fields.
func (o Options) withDefaults() Options {
	o.Duration = cmp.Or(o.Duration, DurationDefault)
	o.Runners = cmp.Or(o.Runners, RunnersDefault)
	o.Keys = cmp.Or(o.Keys, KeysDefault)
	o.ExecBurst = cmp.Or(o.ExecBurst, ExecBurstDefault)
	o.Topology = cmp.Or(o.Topology, TopologyDefault)
	o.Limit = cmp.Or(o.Limit, LimitDefault)
	if o.NetFaults == nil {
		o.NetFaults = NetFaultKinds()
	}
	if o.Seed == 0 {
		o.Seed = time.Now().UnixNano()
	}
	return o
}

// validate lists every problem of o (after withDefaults).
func (o Options) validate() error {
	var errs []error
	if o.Duration < DurationMin {
		errs = append(errs, fmt.Errorf("duration %v: want at least %v", o.Duration, DurationMin))
	}
	if o.Runners < 1 || o.Runners > RunnersMax {
		errs = append(errs, fmt.Errorf("runners %d: want 1 to %d", o.Runners, RunnersMax))
	}
	if o.Keys < 1 {
		errs = append(errs, fmt.Errorf("keys %d: want at least 1", o.Keys))
	}
	if o.Limit < 1 || o.Limit > LimitMax {
		errs = append(errs, fmt.Errorf("limit %d: want 1 to %d", o.Limit, LimitMax))
	}
	for _, k := range o.NetFaults {
		if !slices.Contains(NetFaultKinds(), k) {
			errs = append(errs, fmt.Errorf("network fault %q: want one of %v", k, NetFaultKinds()))
		}
	}
	if o.RunnerBin == "" {
		errs = append(errs, errors.New("RunnerBin: the path of a built runner binary is required"))
	} else if _, err := os.Stat(o.RunnerBin); err != nil {
		errs = append(errs, fmt.Errorf("RunnerBin: %w", err))
	}
	return errors.Join(errs...)
}

// long reports a run longer than the default soak (see DurationDefault).
func (o Options) long() bool { return o.Duration > DurationDefault }
