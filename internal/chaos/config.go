//go:build linux

package chaos

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// execScript is the sync job's stage: log the start, leave two
// daemonised helpers behind (setsid, and a double fork into a new session),
// work 0.2-2.8 s (longer than the lease TTL now and then, and one run in
// four past the stage's 2 s timeout: killed, retried), log the end. The
// helpers must die with the stage, also when it times out.
const execScript = `echo "start $TASKLEASE_KEY $TASKLEASE_FENCING_TOKEN $TASKLEASE_RUN_ID $(date +%s%N) $CHAOS_RUNNER" >> "$CHAOS_EXEC_LOG"
setsid sh -c 'sleep 300' </dev/null >/dev/null 2>&1 &
( setsid sh -c 'sleep 301 & exit 0' </dev/null >/dev/null 2>&1 & )
sleep $(( TASKLEASE_FENCING_TOKEN % 3 )).$(( TASKLEASE_FENCING_TOKEN % 7 + 2 ))
echo "end $TASKLEASE_KEY $TASKLEASE_FENCING_TOKEN $TASKLEASE_RUN_ID $(date +%s%N) $CHAOS_RUNNER" >> "$CHAOS_EXEC_LOG"`

// burstScript is the burst job's stage: log the start, leave a
// double-forked daemon, work 5 s, log the end.
const burstScript = `echo "start $TASKLEASE_KEY $TASKLEASE_FENCING_TOKEN $TASKLEASE_RUN_ID $(date +%s%N) $CHAOS_RUNNER" >> "$CHAOS_EXEC_LOG"
( setsid sh -c 'sleep 302 & exit 0' </dev/null >/dev/null 2>&1 & )
sleep 5
echo "end $TASKLEASE_KEY $TASKLEASE_FENCING_TOKEN $TASKLEASE_RUN_ID $(date +%s%N) $CHAOS_RUNNER" >> "$CHAOS_EXEC_LOG"`

// runnerConfig is the runners' YAML: bulk (http stage to the recorder),
// sync (the exec stage), burst, limited (two http stages to the
// recorder's limited route, each run holding a slot of the limiter
// "remote" of concurrency limit), and, with cron, bulk every second for
// every subject. Where Redis is comes from the environment the topology
// gives the runners (topology.runnerEnv). The limited job's requests name
// the runner incarnation that sent them (limitedRunnerHeader), so the
// report can tell which refused writes came from a runner that was
// SIGSTOPped.
func runnerConfig(recorderURL string, cron bool, every string, limit int) string {
	cfg := fmt.Sprintf(`redis:
  url: "${TASKLEASE_REDIS_URL:-}"
  addrs: [${TASKLEASE_REDIS_ADDRS:-}]
  masterName: "${TASKLEASE_REDIS_MASTER:-}"
  addressMap: {${TASKLEASE_REDIS_ADDRESS_MAP:-}}
partitions: 2
runner:
  id: "${TASKLEASE_RUNNER_ID}"
  concurrency: 400
  leaseTTL: 1s
  shutdownGrace: 1s
log:
  level: info
retention: 1h
historyCap: 2000
limiters:
  %s: {concurrency: %d}
jobs:
  bulk:
    onConflict: join
    foreground: true
    retry: {maxAttempts: 3, backoff: 200ms, maxBackoff: 1s}
    stages:
      - name: push
        http: {url: %q, timeout: 10s}
  sync:
    onConflict: join
    foreground: true
    retry: {maxAttempts: 3, backoff: 100ms, maxBackoff: 500ms}
    stages:
      - name: work
        exec: ["sh", "-c", %q]
        timeout: 2s
        killGrace: 300ms
  burst:
    onConflict: join
    retry: {maxAttempts: 3, backoff: 100ms, maxBackoff: 500ms}
    stages:
      - name: work
        exec: ["sh", "-c", %q]
        timeout: 20s
        killGrace: 300ms
  limited:
    onConflict: join
    foreground: true
    limiters: [%s]
    retry: {maxAttempts: 3, backoff: 100ms, maxBackoff: 500ms}
    stages:
      - name: pull
        http: {url: %q, timeout: 10s, headers: {%s: "${CHAOS_RUNNER:-}"}}
      - name: push
        http: {url: %q, timeout: 10s, headers: {%s: "${CHAOS_RUNNER:-}"}}
`, limiterName, limit, recorderURL+"/push", execScript, burstScript,
		limiterName, recorderURL+limitedPath, limitedRunnerHeader, recorderURL+limitedPath, limitedRunnerHeader)
	if cron {
		cfg += fmt.Sprintf(`schedules:
  - name: %s
    cron: "@every %s"
    scope: bulk
    subjects: all
`, scheduleName, every)
	}
	return cfg
}

// writeConfig writes text into dir/name and checks it with the runner
// binary's `validate`, in the environment the runners get; it returns the
// path.
func (h *harness) writeConfig(name, text string) (string, error) {
	p := filepath.Join(h.dir, name)
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		return "", fmt.Errorf("write %s: %w", name, err)
	}
	cmd := exec.Command(h.bin, "validate", "--config", p)
	cmd.Env = append(os.Environ(), h.topo.runnerEnv()...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("chaos config %s invalid: %w\n%s\n%s", name, err, out, text)
	}
	return p, nil
}
