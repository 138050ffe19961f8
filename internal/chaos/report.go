package chaos

import (
	"fmt"
	"time"
)

// Fault kinds, the keys of Report.FaultsByKind. They are disjoint, so
// Report.Faults is their sum.
const (
	// FaultSigkill is a runner picked at random, SIGKILLed (every process
	// its exec stages started must die with it) and started again.
	FaultSigkill = "sigkill"
	// FaultSigkillLeader is the cron leader SIGKILLed while no fan-out was
	// in progress.
	FaultSigkillLeader = "sigkillLeader"
	// FaultSigkillLeaderMidFanOut is the cron leader SIGKILLed while it was
	// fanning an occurrence out: its successor must resume the fan-out.
	FaultSigkillLeaderMidFanOut = "sigkillLeaderMidFanOut"
	// FaultSigstopPastTTL is a runner SIGSTOPped for 1.5–3 s, past its 1 s
	// lease TTL, then continued: its late writes must be refused.
	FaultSigstopPastTTL = "sigstopPastTTL"
	// FaultGracefulStop is a runner stopped with SIGTERM (the deploy
	// without the schedule, and the end of the run).
	FaultGracefulStop = "gracefulStop"
)

// FaultKinds returns the fault kinds in the order reports show them.
func FaultKinds() []string {
	return []string{FaultSigkill, FaultSigkillLeader, FaultSigkillLeaderMidFanOut,
		FaultSigstopPastTTL, FaultGracefulStop, FaultClientPause, FaultRedisRestartKeepData, FaultRedisRestartEmpty, FaultFailover,
		FaultNetLatency, FaultNetRepliesLost, FaultNetCommandsLost, FaultNetPartition, FaultNetResetPeer, FaultNetBandwidth}
}

// Report is what a run did and found.
type Report struct {
	Topology        string  `json:"topology"`
	Seed            int64   `json:"seed"`
	DurationSeconds float64 `json:"durationSeconds"` // the chaos phase asked for
	ElapsedSeconds  float64 `json:"elapsedSeconds"`  // the whole run, seeding to checks
	Runners         int     `json:"runners"`
	Keys            int     `json:"keys"`     // bulk subjects
	SyncKeys        int     `json:"syncKeys"` // subjects of the exec job
	Partitions      int     `json:"partitions"`

	// Runs is the distinct runs the recorder and the exec log saw.
	Runs         int            `json:"runs"`
	Faults       int            `json:"faults"`
	FaultsByKind map[string]int `json:"faultsByKind"`
	// RefusedStale is the recorder's requests refused for a stale token
	// (RefusedOnArrival + RefusedAtCommit).
	RefusedStale int `json:"refusedStale"`
	// Takeovers counts runs recovered after their holder's lease expired
	// (the history's "recovered" grants, each key and token once).
	Takeovers int `json:"takeovers"`
	// Occurrences is the cron occurrences fired; OccurrencesChecked those
	// checked for exactly one request per subject, over Epochs stretches
	// without Redis data loss.
	Occurrences        int `json:"occurrences"`
	OccurrencesChecked int `json:"occurrencesChecked"`
	Epochs             int `json:"epochs"`

	// Violations is what the checks found, ViolationsByCheck the same by
	// check ("2 tokens never go backwards", …). Details are the messages,
	// the first 8 of each check, each with the offending key's history and
	// recorder lines where they help.
	Violations        int            `json:"violations"`
	ViolationsByCheck map[string]int `json:"violationsByCheck"`
	Details           []string       `json:"details"`

	// DescendantsSeen is the processes of exec stages alive when their
	// runner died; GoneMaxSeconds the longest wait for a dead runner's
	// processes to go.
	DescendantsSeen int `json:"descendantsSeen"`
	// Check 10: the runs whose histories porcupine checked, their
	// operations (HistoryUnconfirmed of them never answered), the runs
	// left out because they came near a Redis fault, and porcupine's
	// verdict (Ok, Illegal, or Unknown when it could not decide in time).
	HistoryRuns           int    `json:"historyRuns"`
	HistoryOps            int    `json:"historyOps"`
	HistoryUnconfirmed    int    `json:"historyUnconfirmed"`
	HistoryRunsNearFaults int    `json:"historyRunsNearFaults"`
	HistoryVerdict        string `json:"historyVerdict"`

	// BurstStages is the exec burst's stages running when the runner
	// holding most of them (BurstStagesOnKilled) was SIGKILLed.
	BurstStages         int     `json:"burstStages"`
	BurstStagesOnKilled int     `json:"burstStagesOnKilled"`
	GoneMaxSeconds      float64 `json:"goneMaxSeconds"`

	// The recorder (the bulk job's fencing downstream).
	Requests             int   `json:"requests"`
	Accepted             int   `json:"accepted"`
	RefusedOnArrival     int   `json:"refusedOnArrival"`
	RefusedAtCommit      int   `json:"refusedAtCommit"`
	Aborted              int   `json:"aborted"` // given up by the runner
	NoKeyHeader          int   `json:"noKeyHeader"`
	PeakLivePerPartition []int `json:"peakLivePerPartition"`

	// The exec job: stage executions, and those overlapping a newer one of
	// their key that a SIGSTOP or the Redis restart explains.
	ExecRuns              int `json:"execRuns"`
	ExecOverlapsExplained int `json:"execOverlapsExplained"`

	// AcceptedChecked is the load's accepted submits (started, joined,
	// queued, replaced) checked for being reflected in a run that ended or
	// is still active; those a Redis fault may have lost are not.
	AcceptedChecked int `json:"acceptedChecked"`
	// RerunChecked is the stage executions (exec starts, accepted http
	// requests) checked against their run having ended done (check 7).
	RerunChecked int `json:"rerunChecked"`
	// PausesChecked is the pauses of the sync scope checked for no grant
	// of its runs (check 8); those overlapping a Redis fault are not.
	PausesChecked int `json:"pausesChecked"`

	// The limited job (check 9): Limit is the concurrency of its limiter,
	// LimitedKeys its subjects. LimitedWrites are its requests at the
	// recorder, LimitedAccepted those accepted, LimitedExecutions the
	// executions (lease grants of its runs) with an accepted write.
	// MaxAcceptedConcurrency is the most executions with accepted writes
	// at one instant (each from its first accepted write to its last):
	// with the limit binding it equals Limit, above it is a violation.
	// SecondsAtLimit is how long Limit of them were.
	Limit                  int     `json:"limit"`
	LimitedKeys            int     `json:"limitedKeys"`
	LimitedWrites          int     `json:"limitedWrites"`
	LimitedAccepted        int     `json:"limitedAccepted"`
	LimitedExecutions      int     `json:"limitedExecutions"`
	MaxAcceptedConcurrency int     `json:"maxAcceptedConcurrency"`
	SecondsAtLimit         float64 `json:"secondsAtLimit"`
	// RefusedLateWrites are the limited job's writes refused by the slot
	// fence because a newer holder of their slot had written: late writes
	// of a holder whose slot expired (SIGSTOP, CLIENT PAUSE, a lost
	// renewal). RefusedLateAfterStop are those of them whose runner was
	// SIGSTOPped while the write was held or in the 5 s before it
	// arrived, RefusedLateAfterPause those near a CLIENT PAUSE of Redis.
	RefusedLateWrites     int `json:"refusedLateWrites"`
	RefusedLateAfterStop  int `json:"refusedLateAfterStop"`
	RefusedLateAfterPause int `json:"refusedLateAfterPause"`
	// LimitedRefusedByKey are its writes refused by the key's fencing
	// token, LimitedAborted those its runner gave up.
	LimitedRefusedByKey int `json:"limitedRefusedByKey"`
	LimitedAborted      int `json:"limitedAborted"`
	// SlotTokensBehindFaults counts its executions that began after a
	// Redis fault with a slot token not above every token of the limiter
	// seen before the fault (the limiter's token went back with the data
	// Redis lost), RefusedBehindFaults their writes refused by the slot
	// fence (not counted in RefusedLateWrites); SlotTokensBehindExample
	// describes the first. SlotTokensTwice counts slot tokens held by two
	// executions, SlotTokensTwiceExample the first.
	SlotTokensBehindFaults  int    `json:"slotTokensBehindFaults"`
	RefusedBehindFaults     int    `json:"refusedBehindFaults"`
	SlotTokensBehindExample string `json:"slotTokensBehindExample,omitempty"`
	SlotTokensTwice         int    `json:"slotTokensTwice"`
	SlotTokensTwiceExample  string `json:"slotTokensTwiceExample,omitempty"`

	// The load, through the runners' APIs.
	Submits         int            `json:"submits"`
	SubmitOutcomes  map[string]int `json:"submitOutcomes"`
	ForegroundHooks int            `json:"foregroundHooks"`
	Cancels         int            `json:"cancels"`
	APIErrors       int            `json:"apiErrors"` // runner down or stopped
	DrainSeconds    float64        `json:"drainSeconds"`
	FinalStatuses   map[string]int `json:"finalStatuses"`

	// RunnerLogErrors is the first panics and ERROR lines of each runner
	// incarnation's log.
	RunnerLogErrors []string `json:"runnerLogErrors"`
	// LogsDir is where the runners' logs were kept, if they were.
	LogsDir string `json:"logsDir,omitempty"`
	// RedisFaults are the faults of Redis itself, in order.
	RedisFaults []RedisFault `json:"redisFaults"`
}

// RedisFault is one fault of Redis: when it began (seconds into the chaos
// phase), its kind, and how long until Redis served again (the failover
// time on Sentinel and Cluster).
type RedisFault struct {
	Kind                string  `json:"kind"`
	AtSeconds           float64 `json:"atSeconds"`
	ServingAfterSeconds float64 `json:"servingAfterSeconds"`
	// ClockLagSeconds: how far the clock of the node serving after it
	// lagged the one before (0: clock faults off).
	ClockLagSeconds float64 `json:"clockLagSeconds"`
}

// Summary renders the report's figures, a line each (without the
// violations' details).
func (r Report) Summary() []string {
	k := r.FaultsByKind
	leader := k[FaultSigkillLeader] + k[FaultSigkillLeaderMidFanOut]
	kills := k[FaultSigkill] + leader
	seconds := func(s float64) time.Duration {
		return time.Duration(s * float64(time.Second)).Round(time.Millisecond)
	}
	lines := []string{
		fmt.Sprintf("runs=%d kills=%d stops=%d redisFaults=%d takeovers=%d refusedStale=%d occurrences=%d violations=%d",
			r.Runs, kills, k[FaultSigstopPastTTL], len(r.RedisFaults), r.Takeovers, r.RefusedStale, r.Occurrences, r.Violations),
		fmt.Sprintf("faults: SIGKILL %d (cron leader %d, of them mid-fan-out %d), SIGSTOP>TTL %d, graceful stops %d, CLIENT PAUSE>TTL %d; Redis restarted keeping its data %d, empty %d, failed over %d; processes of exec stages alive when their runner died %d, all gone within %v unless reported",
			kills, leader, k[FaultSigkillLeaderMidFanOut], k[FaultSigstopPastTTL], k[FaultGracefulStop], k[FaultClientPause],
			k[FaultRedisRestartKeepData], k[FaultRedisRestartEmpty], k[FaultFailover],
			r.DescendantsSeen, seconds(r.GoneMaxSeconds)),
		fmt.Sprintf("network: latency %d, replies lost %d, commands lost %d, partitions %d, resets %d, bandwidth limits %d (one runner's connections to every Redis node each)",
			k[FaultNetLatency], k[FaultNetRepliesLost], k[FaultNetCommandsLost], k[FaultNetPartition], k[FaultNetResetPeer], k[FaultNetBandwidth]),
		fmt.Sprintf("histories: %d runs checked with porcupine, %d operations (%d never answered): %s; %d runs near a Redis fault left out",
			r.HistoryRuns, r.HistoryOps, r.HistoryUnconfirmed, r.HistoryVerdict, r.HistoryRunsNearFaults),
		fmt.Sprintf("exec burst: %d stages running, %d of them on the runner SIGKILLed then", r.BurstStages, r.BurstStagesOnKilled),
		fmt.Sprintf("recorder: %d requests, accepted %d, refused stale %d (on arrival %d, at commit %d), aborted by the runner %d, without a Tasklease-Key header %d; peak live per partition %v",
			r.Requests, r.Accepted, r.RefusedStale, r.RefusedOnArrival, r.RefusedAtCommit, r.Aborted, r.NoKeyHeader, r.PeakLivePerPartition),
		fmt.Sprintf("exec: %d stage executions, %d overlapping ones explained by a SIGSTOP, a CLIENT PAUSE or a Redis fault",
			r.ExecRuns, r.ExecOverlapsExplained),
		fmt.Sprintf("load: %d submits (%v), %d foreground hooks, %d cancels, %d API errors (runner down or stopped); drained in %v, final statuses %v",
			r.Submits, r.SubmitOutcomes, r.ForegroundHooks, r.Cancels, r.APIErrors, seconds(r.DrainSeconds), r.FinalStatuses),
		fmt.Sprintf("cron: %d occurrences fired, %d checked for exactly one request per subject (%d epochs)",
			r.Occurrences, r.OccurrencesChecked, r.Epochs),
		fmt.Sprintf("accepted: %d accepted submits checked for being reflected in a run that ended or is still active",
			r.AcceptedChecked),
		fmt.Sprintf("reruns: %d stage executions checked for starting after their run was done", r.RerunChecked),
		fmt.Sprintf("pauses: %d pauses of the sync scope checked for no lease granted to its runs", r.PausesChecked),
		fmt.Sprintf("limited: limit %d, max accepted concurrency %d (at the limit for %.1fs), %d executions accepted over %d keys; %d writes, accepted %d, refused late %d (by the slot fence; of them after a SIGSTOP of their runner %d, near a CLIENT PAUSE %d), refused by the key fence %d, aborted by the runner %d",
			r.Limit, r.MaxAcceptedConcurrency, r.SecondsAtLimit, r.LimitedExecutions, r.LimitedKeys, r.LimitedWrites, r.LimitedAccepted,
			r.RefusedLateWrites, r.RefusedLateAfterStop, r.RefusedLateAfterPause, r.LimitedRefusedByKey, r.LimitedAborted),
	}
	if r.SlotTokensBehindFaults > 0 {
		lines = append(lines, fmt.Sprintf("limited: %d executions began after a Redis fault with a slot token not above the limiter's earlier ones, and %d of their writes were refused by the slot fence; the first: %s",
			r.SlotTokensBehindFaults, r.RefusedBehindFaults, r.SlotTokensBehindExample))
	}
	if r.SlotTokensTwice > 0 {
		lines = append(lines, fmt.Sprintf("limited: %d slot tokens were held by two executions; the first: %s", r.SlotTokensTwice, r.SlotTokensTwiceExample))
	}
	for _, f := range r.RedisFaults {
		lag := ""
		if f.ClockLagSeconds > 0 {
			lag = fmt.Sprintf(", onto a clock %v behind", seconds(f.ClockLagSeconds))
		}
		lines = append(lines, fmt.Sprintf("redis fault at %.1fs: %s%s, serving again after %v", f.AtSeconds, f.Kind, lag, seconds(f.ServingAfterSeconds)))
	}
	return append(lines, r.RunnerLogErrors...)
}
