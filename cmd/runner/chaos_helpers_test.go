//go:build linux

// The machinery of TestChaosE2E (chaos_test.go): what it records (the
// fencing-aware recorder, the exec stage's log, Redis read-only), the
// runner processes and the processes they start, the load and the faults.

package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/keyspace"
	"github.com/tasklease/tasklease/jobs"
	"github.com/tasklease/tasklease/taskkey"
)

// The checks of TestChaosE2E, as violations are filed under them.
const (
	checkStuck      = "1 no stuck key"
	checkTokens     = "2 tokens never go backwards"
	checkDescendant = "3 no surviving descendant"
	checkOnce       = "4 exactly once per occurrence"
	checkOverlap    = "5 no overlapping executions"
)

// chaosViolations collects what the checker found, by check.
type chaosViolations struct {
	mu sync.Mutex
	by map[string][]string
}

func (v *chaosViolations) add(check, format string, args ...any) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.by == nil {
		v.by = map[string][]string{}
	}
	v.by[check] = append(v.by[check], fmt.Sprintf(format, args...))
}

func (v *chaosViolations) count() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	n := 0
	for _, l := range v.by {
		n += len(l)
	}
	return n
}

// report fails t once per violated check, with its first violations.
func (v *chaosViolations) report(t *testing.T, replay string) {
	t.Helper()
	v.mu.Lock()
	defer v.mu.Unlock()
	checks := make([]string, 0, len(v.by))
	for c := range v.by {
		checks = append(checks, c)
	}
	sort.Strings(checks)
	for _, c := range checks {
		l := v.by[c]
		shown := l[:min(len(l), 8)]
		t.Errorf("chaos-e2e: check %q: %d violation(s) (replay: %s); first %d:\n%s",
			c, len(l), replay, len(shown), strings.Join(shown, "\n----\n"))
	}
}

// ---------------------------------------------------------------------------
// The recorder: a fencing-aware HTTP downstream for the bulk job's stage.

// recReq is one request the recorder saw.
type recReq struct {
	key, runID    string
	token         int64
	attempt       int
	arrive, end   time.Time
	outcome       string // accepted | refused-arrival | refused-commit | aborted
	keyHeader     bool   // the request carried Tasklease-Key
	headerMatches bool   // Tasklease-Fencing-Token equals the body's fencingToken
}

const (
	recAccepted       = "accepted"
	recRefusedArrival = "refused-arrival"
	recRefusedCommit  = "refused-commit"
	recAborted        = "aborted"
)

func (r *recReq) refused() bool {
	return r.outcome == recRefusedArrival || r.outcome == recRefusedCommit
}

func (r *recReq) String() string {
	end := "-"
	if !r.end.IsZero() {
		end = r.end.Format("15:04:05.000")
	}
	return fmt.Sprintf("recorder %s token %d run %s attempt %d: %s..%s %s",
		r.key, r.token, r.runID, r.attempt, r.arrive.Format("15:04:05.000"), end, r.outcome)
}

// recorder answers the bulk job's http stage like a downstream that checks
// fencing tokens: per key it remembers the highest token it has seen; a
// request with a lower one is refused with 409 when it arrives, and a
// request that is still being held when a higher token arrives is refused
// when it would commit (the write of a deposed holder). Every request is
// held 0.2–2 s (seeded), so hundreds of runs are live at once.
type recorder struct {
	ks  *keyspace.Space
	srv *httptest.Server

	mu      sync.Mutex
	rng     *rand.Rand
	highest map[string]int64
	reqs    []*recReq
	byKey   map[string][]*recReq
	live    []int // requests being held, per partition
	peak    []int
}

func newRecorder(t *testing.T, seed int64, ks *keyspace.Space) *recorder {
	r := &recorder{ks: ks, rng: rand.New(rand.NewPCG(uint64(seed), 0x7265636f7264)),
		highest: map[string]int64{}, byKey: map[string][]*recReq{},
		live: make([]int, ks.Partitions()), peak: make([]int, ks.Partitions())}
	r.srv = httptest.NewServer(r) // 127.0.0.1 only
	t.Cleanup(r.srv.Close)
	return r
}

func (r *recorder) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	arrive := time.Now()
	var body struct {
		Key          string `json:"key"`
		RunID        string `json:"runId"`
		Attempt      int    `json:"attempt"`
		FencingToken int64  `json:"fencingToken"`
	}
	if err := json.NewDecoder(req.Body).Decode(&body); err != nil || body.Key == "" {
		http.Error(w, "bad body", http.StatusBadRequest)
		return
	}
	hdrTok, _ := strconv.ParseInt(req.Header.Get("Tasklease-Fencing-Token"), 10, 64)
	part := 0
	if k, err := taskkey.Parse(body.Key); err == nil {
		part = r.ks.Partition(k)
	}
	rr := &recReq{key: body.Key, runID: body.RunID, token: body.FencingToken, attempt: body.Attempt,
		arrive: arrive, keyHeader: req.Header.Get("Tasklease-Key") == body.Key, headerMatches: hdrTok == body.FencingToken}

	r.mu.Lock()
	r.reqs = append(r.reqs, rr)
	r.byKey[rr.key] = append(r.byKey[rr.key], rr)
	hold := 200*time.Millisecond + time.Duration(r.rng.Int64N(int64(1800*time.Millisecond)))
	if rr.token < r.highest[rr.key] {
		rr.outcome, rr.end = recRefusedArrival, time.Now()
		r.mu.Unlock()
		http.Error(w, "stale fencing token", http.StatusConflict)
		return
	}
	r.highest[rr.key] = rr.token
	r.live[part]++
	r.peak[part] = max(r.peak[part], r.live[part])
	r.mu.Unlock()

	timer := time.NewTimer(hold)
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-req.Context().Done(): // the runner gave up (lease lost, cancel, kill)
		r.mu.Lock()
		r.live[part]--
		rr.outcome, rr.end = recAborted, time.Now()
		r.mu.Unlock()
		return
	}
	r.mu.Lock()
	r.live[part]--
	if rr.token < r.highest[rr.key] {
		rr.outcome, rr.end = recRefusedCommit, time.Now()
		r.mu.Unlock()
		http.Error(w, "stale fencing token", http.StatusConflict)
		return
	}
	rr.outcome, rr.end = recAccepted, time.Now()
	r.mu.Unlock()
	w.WriteHeader(http.StatusOK)
}

// snapshot returns copies of every request (finished or not).
func (r *recorder) snapshot() []recReq {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]recReq, len(r.reqs))
	for i, rr := range r.reqs {
		out[i] = *rr
	}
	return out
}

// lines describes key's last n requests.
func (r *recorder) lines(key string, n int) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.byKey[key]
	var b strings.Builder
	for _, rr := range l[max(0, len(l)-n):] {
		b.WriteString("  " + rr.String() + "\n")
	}
	if b.Len() == 0 {
		return "  (no recorder requests)\n"
	}
	return b.String()
}

// around describes up to n of key's requests on each side of t.
func (r *recorder) around(key string, t time.Time, n int) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.byKey[key]
	i := sort.Search(len(l), func(i int) bool { return l[i].arrive.After(t) })
	var b strings.Builder
	for _, rr := range l[max(0, i-n):min(len(l), i+n)] {
		b.WriteString("  " + rr.String() + "\n")
	}
	if b.Len() == 0 {
		return "  (no recorder requests)\n"
	}
	return b.String()
}

func (r *recorder) peaks() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.peak)
}

// ---------------------------------------------------------------------------
// Runner processes.

// chaosRunner is one incarnation of a `runner serve` process. Every
// process it starts inherits CHAOS_RUNNER=<marker>, unique per incarnation.
type chaosRunner struct {
	id, marker, url, logPath string
	inc                      int
	cmd                      *exec.Cmd
	done                     chan struct{}
	err                      error

	ownerOnce sync.Mutex
	owner     string // the scheduler's owner, from the log
}

func (p *chaosRunner) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

var schedOwnerRE = regexp.MustCompile(`component=scheduler owner=(\S+)`)

// schedOwner is the owner this incarnation's scheduler writes into the
// leader mutex ("<id>/<suffix>"), read from its log; "" until it logged it.
func (p *chaosRunner) schedOwner() string {
	p.ownerOnce.Lock()
	defer p.ownerOnce.Unlock()
	if p.owner != "" {
		return p.owner
	}
	f, err := os.Open(p.logPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	buf := make([]byte, 256<<10)
	n, _ := f.Read(buf)
	if m := schedOwnerRE.FindSubmatch(buf[:n]); m != nil {
		p.owner = strings.Trim(string(m[1]), `"`)
	}
	return p.owner
}

// tail returns the last n lines of the runner's log.
func (p *chaosRunner) tail(n int) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// logErrors returns the panics and ERROR lines of the runner's log.
func (p *chaosRunner) logErrors() []string {
	f, err := os.Open(p.logPath)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if l := sc.Text(); strings.Contains(l, "level=ERROR") || strings.HasPrefix(l, "panic") || strings.Contains(l, "DATA RACE") {
			out = append(out, l)
		}
	}
	return out
}

// ---------------------------------------------------------------------------
// Processes carrying a runner's marker.

type markedProc struct {
	pid                  int
	marker, key, cmdline string
}

func (m markedProc) String() string {
	return fmt.Sprintf("pid %d [%s] key %q marker %s", m.pid, m.cmdline, m.key, m.marker)
}

// scanMarked lists the live (non-zombie) processes whose environment holds
// CHAOS_RUNNER=<value> with value == marker, or starting with marker when
// prefix is true.
func scanMarked(marker string, prefix bool) []markedProc {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	needle := []byte("CHAOS_RUNNER=" + marker)
	var out []markedProc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil || !bytes.Contains(env, needle) {
			continue
		}
		m := markedProc{pid: pid}
		for _, kv := range bytes.Split(env, []byte{0}) {
			s := string(kv)
			switch {
			case strings.HasPrefix(s, "CHAOS_RUNNER="):
				m.marker = strings.TrimPrefix(s, "CHAOS_RUNNER=")
			case strings.HasPrefix(s, "TASKLEASE_KEY="):
				m.key = strings.TrimPrefix(s, "TASKLEASE_KEY=")
			}
		}
		if m.marker != marker && !(prefix && strings.HasPrefix(m.marker, marker)) {
			continue
		}
		if stat, err := os.ReadFile("/proc/" + e.Name() + "/stat"); err == nil {
			if i := bytes.LastIndexByte(stat, ')'); i > 0 && i+2 < len(stat) && (stat[i+2] == 'Z' || stat[i+2] == 'X') {
				continue // dead, waiting to be reaped
			}
		}
		cmdline, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		m.cmdline = strings.TrimSpace(string(bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '})))
		out = append(out, m)
	}
	return out
}

// killMarked SIGKILLs what scanMarked finds (cleanup after a violation or
// the test: no helper of a broken build may outlive it).
func killMarked(marker string, prefix bool) int {
	ps := scanMarked(marker, prefix)
	for _, p := range ps {
		_ = syscall.Kill(p.pid, syscall.SIGKILL)
	}
	return len(ps)
}

// ---------------------------------------------------------------------------
// Reading Redis (read-only).

// grant is a lease grant in a key's history (started or recovered).
type grant struct {
	at     int64 // Redis ms
	token  int64
	event  string
	runID  string
	source string
}

// schedReq is a request event with source schedule in a key's history.
type schedReq struct {
	at, last, count int64 // first and last request (coalesced repeats), how many
	event           string
	outcome         string
}

// keyData is what one key's Redis state says, compactly.
type keyData struct {
	grants []grant    // chronological
	sched  []schedReq // chronological
	first  int64      // at of the oldest history event kept (0: none)
	events int
	lease  int64 // token of the lease, 0 if none
	task   int64 // token in the run record, 0 if none
}

// known reports the tokens this key's state names.
func (d *keyData) tokens() []int64 {
	out := []int64{d.lease, d.task}
	for _, g := range d.grants {
		out = append(out, g.token)
	}
	return out
}

func fieldStr(f map[string]any, k string) string { s, _ := f[k].(string); return s }
func fieldInt(f map[string]any, k string) int64 {
	n, _ := strconv.ParseInt(fieldStr(f, k), 10, 64)
	return n
}

// historyReader returns a Registry that reads the histories of keys (it
// knows their scopes; it never runs or submits anything).
func historyReader(rdb *redis.Client, ks *keyspace.Space, keys []taskkey.Key) (*jobs.Registry, error) {
	var js []jobs.Job
	seen := map[string]bool{}
	for _, k := range keys {
		if !seen[k.Scope()] {
			seen[k.Scope()] = true
			js = append(js, jobs.Job{Scope: k.Scope(), Stages: []jobs.Stage{{Name: "read", Handler: jobs.HandlerFunc(
				func(context.Context, *jobs.Run) error { return nil })}}})
		}
	}
	return jobs.NewRegistry(rdb, jobs.Config{Prefix: ks.Prefix(), Partitions: ks.Partitions(), Jobs: js,
		HistoryCap: chaosHistoryCap, Logger: slog.New(slog.DiscardHandler)})
}

// readKeys reads the history (with coalesced counts), lease and record
// token of every key.
func readKeys(ctx context.Context, rdb *redis.Client, ks *keyspace.Space, keys []taskkey.Key) (map[string]*keyData, error) {
	reg, err := historyReader(rdb, ks, keys)
	if err != nil {
		return nil, err
	}
	out := make(map[string]*keyData, len(keys))
	const chunk = 32
	for i := 0; i < len(keys); i += chunk {
		part := keys[i:min(i+chunk, len(keys))]
		pipe := rdb.Pipeline()
		type cmds struct{ lease, token *redis.StringCmd }
		cs := make([]cmds, len(part))
		for j, k := range part {
			cs[j] = cmds{lease: pipe.Get(ctx, ks.Lease(k)), token: pipe.HGet(ctx, ks.Task(k), "token")}
		}
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return nil, err
		}
		for j, k := range part {
			evs, err := reg.History(ctx, k.Subject(), k.Scope(), chaosHistoryCap)
			if err != nil {
				return nil, err
			}
			slices.Reverse(evs) // chronological
			d := &keyData{events: len(evs)}
			for n, e := range evs {
				at := e.At.UnixMilli()
				if n == 0 {
					d.first = at
				}
				switch e.Event {
				case "started", "recovered":
					d.grants = append(d.grants, grant{at: at, token: e.FencingToken, event: e.Event, runID: e.RunID, source: e.Source})
				case "requested", "joined", "skipped", "throttled":
					if e.Source == "schedule" {
						last := at
						if e.LastAt != nil {
							last = e.LastAt.UnixMilli()
						}
						d.sched = append(d.sched, schedReq{at: at, last: last, count: int64(e.Count), event: e.Event, outcome: e.Outcome})
					}
				}
			}
			if v := cs[j].lease.Val(); v != "" {
				d.lease, _ = strconv.ParseInt(strings.SplitN(v, "|", 2)[0], 10, 64)
			}
			d.task, _ = strconv.ParseInt(cs[j].token.Val(), 10, 64)
			out[k.String()] = d
		}
	}
	return out, nil
}

// historyLines renders key's last n history events (newest last) for a
// failure message.
func historyLines(ctx context.Context, rdb *redis.Client, ks *keyspace.Space, k taskkey.Key, n int) string {
	reg, err := historyReader(rdb, ks, []taskkey.Key{k})
	if err != nil {
		return "  (history: " + err.Error() + ")\n"
	}
	evs, err := reg.History(ctx, k.Subject(), k.Scope(), n)
	if err != nil {
		return "  (history: " + err.Error() + ")\n"
	}
	var b strings.Builder
	for _, e := range slices.Backward(evs) {
		fmt.Fprintf(&b, "  history %s %-15s run=%s source=%s stage=%s outcome=%s owner=%s token=%d count=%d error=%q\n",
			e.At.Format("15:04:05.000"), e.Event, e.RunID, e.Source, e.Stage, e.Outcome, e.Owner, e.FencingToken, e.Count, e.Error)
	}
	if b.Len() == 0 {
		return "  (no history)\n"
	}
	return b.String()
}

// occState is a fan-out state hash as observed (lua/cron_claim.lua).
type occState struct {
	occ                   int64 // unix seconds
	startedAt, finishedAt int64 // Redis ms
	done, abandoned       bool
	resumes, submitted    int64
	duplicates            int64
	owner                 string
}

func parseOccState(h map[string]string) (occState, bool) {
	if len(h) == 0 || h["occ"] == "" {
		return occState{}, false
	}
	i := func(k string) int64 { n, _ := strconv.ParseInt(h[k], 10, 64); return n }
	return occState{occ: i("occ"), startedAt: i("startedAt"), finishedAt: i("finishedAt"),
		done: h["done"] == "1", abandoned: h["abandoned"] == "1", resumes: i("resumes"),
		submitted: i("submitted"), duplicates: i("duplicates"), owner: h["owner"]}, true
}

// firedOccurrences lists the occurrences of schedule whose idempotency
// keys exist (both the hash-tagged and the older layout), sorted.
func firedOccurrences(ctx context.Context, rdb *redis.Client, prefix, schedule string) ([]int64, error) {
	seen := map[int64]bool{}
	for _, pat := range []string{"{" + prefix + ":cron:" + schedule + "}:fired:*", prefix + ":cron:fired:" + schedule + ":*"} {
		iter := rdb.Scan(ctx, 0, pat, 1000).Iterator()
		for iter.Next(ctx) {
			k := iter.Val()
			if n, err := strconv.ParseInt(k[strings.LastIndexByte(k, ':')+1:], 10, 64); err == nil {
				seen[n] = true
			}
		}
		if err := iter.Err(); err != nil {
			return nil, err
		}
	}
	out := make([]int64, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	slices.Sort(out)
	return out, nil
}

// redisNowMs is Redis TIME in milliseconds.
func redisNowMs(ctx context.Context, rdb *redis.Client) (int64, error) {
	t, err := rdb.Time(ctx).Result()
	if err != nil {
		return 0, err
	}
	return t.UnixMilli(), nil
}

// ---------------------------------------------------------------------------
// The exec stage's log.

// execLine is one line the sync job's stage appended.
type execLine struct {
	phase, key, runID, marker string
	token                     int64
	at                        time.Time
}

func readExecLog(path string) ([]execLine, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []execLine
	for n, l := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		if l == "" {
			continue
		}
		fs := strings.Fields(l)
		if len(fs) != 6 {
			return nil, fmt.Errorf("exec log line %d malformed: %q", n+1, l)
		}
		tok, err1 := strconv.ParseInt(fs[2], 10, 64)
		ns, err2 := strconv.ParseInt(fs[4], 10, 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("exec log line %d malformed: %q", n+1, l)
		}
		out = append(out, execLine{phase: fs[0], key: fs[1], token: tok, runID: fs[3], at: time.Unix(0, ns), marker: fs[5]})
	}
	return out, nil
}

// chaosExecScript is the sync job's stage: log the start, leave two
// daemonised helpers behind (setsid, and a double fork into a new session),
// work 0.2-2.8 s (longer than the lease TTL now and then), log the end. The helpers must die with the stage.
const chaosExecScript = `echo "start $TASKLEASE_KEY $TASKLEASE_FENCING_TOKEN $TASKLEASE_RUN_ID $(date +%s%N) $CHAOS_RUNNER" >> "$CHAOS_EXEC_LOG"
setsid sh -c 'sleep 300' </dev/null >/dev/null 2>&1 &
( setsid sh -c 'sleep 301 & exit 0' </dev/null >/dev/null 2>&1 & )
sleep $(( TASKLEASE_FENCING_TOKEN % 3 )).$(( TASKLEASE_FENCING_TOKEN % 7 + 2 ))
echo "end $TASKLEASE_KEY $TASKLEASE_FENCING_TOKEN $TASKLEASE_RUN_ID $(date +%s%N) $CHAOS_RUNNER" >> "$CHAOS_EXEC_LOG"`

// chaosConfig is the runners' YAML: bulk (http stage to the recorder),
// sync (the exec stage), and, with cron, bulk every second for every
// subject.
func chaosConfig(recorderURL string, cron bool, every string) string {
	cfg := fmt.Sprintf(`partitions: 2
runner:
  id: "${TASKLEASE_RUNNER_ID}"
  concurrency: 400
  leaseTTL: 1s
  shutdownGrace: 1s
log:
  level: info
retention: 1h
historyCap: 2000
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
        killGrace: 300ms
`, recorderURL+"/push", chaosExecScript)
	if cron {
		cfg += fmt.Sprintf(`schedules:
  - name: %s
    cron: "@every %s"
    scope: bulk
    subjects: all
`, chaosSchedule, every)
	}
	return cfg
}

// chaosClient is the load's and the checker's HTTP client: a stopped
// runner must not hang them.
var chaosClient = &http.Client{Timeout: 3 * time.Second}

// chaosPost POSTs a JSON body and decodes a 200 answer into out.
func chaosPost(url, body string, out any) (int, error) {
	resp, err := chaosClient.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		return resp.StatusCode, fmt.Errorf("POST %s: %s: %s", url, resp.Status, strings.TrimSpace(b.String()))
	}
	if out == nil {
		return resp.StatusCode, nil
	}
	return resp.StatusCode, json.NewDecoder(resp.Body).Decode(out)
}

// chaosGet GETs url into out (only on 200) and returns the status.
func chaosGet(url string, out any) (int, error) {
	resp, err := chaosClient.Get(url)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK && out != nil {
		return resp.StatusCode, json.NewDecoder(resp.Body).Decode(out)
	}
	return resp.StatusCode, nil
}

// writeFile writes text into dir/name and returns the path.
func writeFile(t *testing.T, dir, name, text string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// keepLogs copies the runners' logs and the exec log into dir.
func (h *chaosHarness) keepLogs(dir string) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		h.t.Errorf("TASKLEASE_CHAOS_LOGS: %v", err)
		return
	}
	paths := []string{h.execLog}
	for _, p := range h.allRunners() {
		paths = append(paths, p.logPath)
	}
	for _, p := range paths {
		if b, err := os.ReadFile(p); err == nil {
			_ = os.WriteFile(dir+"/"+p[strings.LastIndexByte(p, '/')+1:], b, 0o644)
		}
	}
	h.t.Logf("chaos-e2e: logs kept in %s", dir)
}

// logf logs a fault with its time since the chaos began.
func (h *chaosHarness) logf(format string, args ...any) {
	h.t.Helper()
	h.t.Logf("chaos-e2e: +%5.1fs "+format, append([]any{time.Since(h.t0).Seconds()}, args...)...)
}

// procList renders up to 12 processes, one a line.
func procList(ps []markedProc) string {
	var b strings.Builder
	for i, m := range ps {
		if i == 12 {
			fmt.Fprintf(&b, "  … and %d more\n", len(ps)-i)
			break
		}
		b.WriteString("  " + m.String() + "\n")
	}
	return b.String()
}

func mustRead(p string) string { b, _ := os.ReadFile(p); return string(b) }

// ---------------------------------------------------------------------------
// Runners.

// start starts a new incarnation of runner id with config cfg and waits
// until it is ready.
func (h *chaosHarness) start(id, cfg string) *chaosRunner {
	t := h.t
	t.Helper()
	for attempt := 1; ; attempt++ {
		h.mu.Lock()
		h.incs++
		inc := h.incs
		h.mu.Unlock()
		addr := fmt.Sprintf("127.0.0.1:%d", deadPort(t))
		p := &chaosRunner{id: id, inc: inc, marker: fmt.Sprintf("%s/%s/%d", h.nonce, id, inc), url: "http://" + addr,
			logPath: fmt.Sprintf("%s/runner-%s-%d.log", h.dir, id, inc), done: make(chan struct{})}
		logf, err := os.Create(p.logPath)
		if err != nil {
			t.Fatal(err)
		}
		p.cmd = exec.Command(h.bin, "serve", "--config", cfg, "--redis", h.redisURL, "--listen", addr)
		p.cmd.Env = append(os.Environ(), "TASKLEASE_RUNNER_ID="+id, "TASKLEASE_TOKEN=",
			"CHAOS_RUNNER="+p.marker, "CHAOS_EXEC_LOG="+h.execLog)
		p.cmd.Stdout, p.cmd.Stderr = logf, logf
		p.cmd.SysProcAttr = runnerProcAttr()
		if err := p.cmd.Start(); err != nil {
			t.Fatalf("start %s: %v", id, err)
		}
		go func() { p.err = p.cmd.Wait(); logf.Close(); close(p.done) }()
		t.Cleanup(func() {
			if !p.exited() {
				_ = p.cmd.Process.Signal(syscall.SIGCONT)
				_ = p.cmd.Process.Kill()
				<-p.done
			}
		})
		deadline := time.Now().Add(20 * time.Second)
		for {
			if p.exited() {
				if attempt < 3 && strings.Contains(p.tail(20), "address already in use") {
					break
				}
				t.Fatalf("%s#%d exited before it was ready: %v\n%s", id, inc, p.err, p.tail(40))
			}
			if code, err := getJSON(p.url+"/readyz", "", nil); err == nil && code == http.StatusOK {
				h.mu.Lock()
				h.runners[id] = p
				h.all = append(h.all, p)
				h.mu.Unlock()
				return p
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s#%d not ready within 20s:\n%s", id, inc, p.tail(40))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

func (h *chaosHarness) current() []*chaosRunner {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]*chaosRunner, 0, len(h.ids))
	for _, id := range h.ids {
		if p := h.runners[id]; p != nil {
			out = append(out, p)
		}
	}
	return out
}

func (h *chaosHarness) allRunners() []*chaosRunner {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.all)
}

// url returns a random current runner's API (it may be stopped or dying:
// callers tolerate errors).
func (h *chaosHarness) url(rng *rand.Rand) string {
	cur := h.current()
	return cur[rng.IntN(len(cur))].url
}

// kill SIGKILLs p, checks that every process it started dies with it, and
// starts a new incarnation of the same runner.
func (h *chaosHarness) kill(p *chaosRunner) {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
	h.kills.Add(1)
	h.logf("SIGKILL %s#%d", p.id, p.inc)
	h.bg.Go(func() { h.checkGone(p, "SIGKILL") })
	time.Sleep(time.Duration(200+h.rng.IntN(500)) * time.Millisecond)
	h.start(p.id, h.cfgCron)
}

// terminate stops p gracefully (SIGTERM) and checks its descendants go too.
func (h *chaosHarness) terminate(p *chaosRunner) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		h.graceful.Add(1)
	case <-time.After(20 * time.Second):
		h.viol.add(checkStuck, "%s#%d did not exit within 20s of SIGTERM (shutdownGrace 1s); log tail:\n%s", p.id, p.inc, p.tail(30))
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	h.checkGone(p, "SIGTERM")
}

// checkGone waits until no process carries p's marker (a runner's exec
// stages, their supervisors and daemons); 5 s after p's death any left is a
// violation.
func (h *chaosHarness) checkGone(p *chaosRunner, how string) {
	begin := time.Now()
	first := scanMarked(p.marker, false)
	h.descSeen.Add(int64(len(first)))
	deadline := begin.Add(5 * time.Second)
	for {
		left := scanMarked(p.marker, false)
		if len(left) == 0 {
			if d := int64(time.Since(begin)); d > h.goneMax.Load() {
				h.goneMax.Store(d)
			}
			return
		}
		if time.Now().After(deadline) {
			h.viol.add(checkDescendant, "5s after %s of %s#%d (%d of its processes alive right after it died), %d still alive:\n%s",
				how, p.id, p.inc, len(first), len(left), procList(left))
			killMarked(p.marker, false)
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ---------------------------------------------------------------------------
// Load and faults.

// seedSubjects submits one manual request for every bulk subject ("all"
// means subjects requested by anything but a schedule) and returns the
// Redis time once all are accepted.
func (h *chaosHarness) seedSubjects() int64 {
	t := h.t
	work := make(chan string)
	var failed atomic.Int64
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(h.seed), uint64(100+w)))
			for s := range work {
				deadline := time.Now().Add(20 * time.Second)
				for {
					_, err := chaosPost(h.url(rng)+taskPath(s, chaosBulk)+"/runs", `{"source":"manual"}`, nil)
					if err == nil {
						break
					}
					if time.Now().After(deadline) {
						failed.Add(1)
						break
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
		})
	}
	for _, s := range h.bulk {
		work <- s
	}
	close(work)
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("chaos-e2e: %d bulk subjects could not be submitted within 20s", n)
	}
	now, err := redisNowMs(context.Background(), h.rdb)
	if err != nil {
		t.Fatalf("redis TIME: %v", err)
	}
	return now
}

// load submits and cancels at random through random runners' APIs.
func (h *chaosHarness) load(ctx context.Context, worker int) {
	rng := rand.New(rand.NewPCG(uint64(h.seed), uint64(10+worker)))
	policies := []string{"join", "join", "join", "queue", "queue", "replace"}
	for ctx.Err() == nil {
		base := h.url(rng)
		bulkSubj, syncSubj := h.bulk[rng.IntN(len(h.bulk))], h.syncs[rng.IntN(len(h.syncs))]
		var err error
		var res jobs.SubmitResult
		switch r := rng.IntN(100); {
		case r < 35, r >= 45 && r < 70:
			subj, scope := bulkSubj, chaosBulk
			if r >= 45 {
				subj, scope = syncSubj, chaosSync
			}
			src := []string{"manual", "manual", "foreground"}[rng.IntN(3)]
			_, err = chaosPost(base+taskPath(subj, scope)+"/runs",
				fmt.Sprintf(`{"source":%q,"policy":%q}`, src, policies[rng.IntN(len(policies))]), &res)
			if err == nil {
				h.submits.Add(1)
				h.mu.Lock()
				h.outc[string(res.Outcome)]++
				h.mu.Unlock()
			}
		case r < 45, r >= 70 && r < 80:
			subj, scope := bulkSubj, chaosBulk
			if r >= 70 {
				subj, scope = syncSubj, chaosSync
			}
			_, err = chaosPost(base+"/v1/hooks/foreground", fmt.Sprintf(`{"subject":%q,"scopes":[%q]}`, subj, scope), nil)
			if err == nil {
				h.fgs.Add(1)
			}
		default:
			subj, scope := bulkSubj, chaosBulk
			if r >= 90 {
				subj, scope = syncSubj, chaosSync
			}
			_, err = chaosPost(base+taskPath(subj, scope)+"/cancel", "", nil)
			if err == nil {
				h.cancels.Add(1)
			}
		}
		if err != nil {
			h.errs.Add(1)
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Duration(20+rng.IntN(40)) * time.Millisecond):
		}
	}
}

// pollState records the cron fan-out state of each occurrence it sees
// (its claim and finish times bound the occurrence's requests).
func (h *chaosHarness) pollState(ctx context.Context) {
	for ctx.Err() == nil {
		h.stMu.Lock()
		ep := len(h.states) - 1
		h.stMu.Unlock()
		m, err := h.rdb.HGetAll(ctx, h.stateKey).Result()
		if st, ok := parseOccState(m); err == nil && ok {
			h.stMu.Lock()
			if ep == len(h.states)-1 {
				h.states[ep][st.occ] = st
			}
			h.stMu.Unlock()
		}
		select {
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// faults runs the fault schedule for dur: runners SIGKILLed (the cron
// leader mid-fan-out now and then) and restarted, runners SIGSTOPped past
// their lease TTL, and Redis restarted empty once.
func (h *chaosHarness) faults(dur time.Duration, long bool) {
	start := time.Now()
	end := start.Add(dur)
	restartAt := start.Add(dur * 4 / 10)
	if long {
		restartAt = start.Add(dur / 2)
	}
	nextLeader := start.Add(3 * time.Second)
	leaderEvery := max(30*time.Second, dur/8)
	nextRandom := start.Add(time.Duration(1500+h.rng.IntN(1500)) * time.Millisecond)
	restarted := false
	var lastCont time.Time // the end of the latest SIGSTOP
	pendingOcc := ""       // a fan-out left unfinished by a killed leader
	for time.Now().Before(end) {
		now := time.Now()
		// A killed leader's successor takes over after the leader TTL
		// (10 s) and resumes the fan-out: the Redis restart waits for that
		// (at most 10 s), so the resume is checked, and no SIGSTOPped
		// runner's late writes straddle the data loss.
		resumed := pendingOcc == "" || h.fanOutFinished(pendingOcc)
		switch {
		case !restarted && !now.Before(restartAt) && now.After(lastCont.Add(2*time.Second)) &&
			(resumed || now.After(restartAt.Add(10*time.Second))):
			h.restartRedis()
			restarted, pendingOcc = true, ""
			nextRandom = time.Now().Add(2 * time.Second)
		case !now.Before(nextLeader) && now.Before(end.Add(-15*time.Second)) &&
			(restarted && now.After(h.redisUp.Add(2*time.Second)) || !restarted && (h.leaderKills.Load() == 0 || now.Before(restartAt.Add(-15*time.Second)))):
			if occ := h.killLeader(); occ != "" {
				pendingOcc = occ
			}
			nextLeader = nextLeader.Add(leaderEvery)
		case !now.Before(nextRandom):
			cur := h.current()
			p := cur[h.rng.IntN(len(cur))]
			if h.rng.IntN(2) == 0 {
				h.kill(p)
			} else {
				h.stop(p, time.Duration(1500+h.rng.IntN(1500))*time.Millisecond)
				lastCont = time.Now()
			}
			nextRandom = time.Now().Add(time.Duration(1500+h.rng.IntN(2000)) * time.Millisecond)
		default:
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// fanOutFinished reports whether the fan-out of occurrence occ is done
// (or a later occurrence has been claimed since).
func (h *chaosHarness) fanOutFinished(occ string) bool {
	st, err := h.rdb.HMGet(context.Background(), h.stateKey, "occ", "done").Result()
	if err != nil || len(st) != 2 {
		return false
	}
	return st[0] != occ || st[1] == "1"
}

// stop SIGSTOPs p for d (longer than the lease TTL), then SIGCONTs it.
func (h *chaosHarness) stop(p *chaosRunner, d time.Duration) {
	from := time.Now()
	_ = p.cmd.Process.Signal(syscall.SIGSTOP)
	h.stops.Add(1)
	h.logf("SIGSTOP %s#%d for %v", p.id, p.inc, d.Round(time.Millisecond))
	time.Sleep(d)
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	h.mu.Lock()
	h.stopLog = append(h.stopLog, chaosStop{marker: p.marker, from: from, to: time.Now()})
	h.mu.Unlock()
}

// killLeader SIGKILLs the cron leader, while a fan-out is in progress when
// it can catch one (occurrences are on whole seconds), and restarts it. It
// returns the occurrence of the fan-out it interrupted, if it did.
func (h *chaosHarness) killLeader() string {
	ctx := context.Background()
	var target *chaosRunner
	for deadline := time.Now().Add(5 * time.Second); target == nil && time.Now().Before(deadline); {
		v, _ := h.rdb.Get(ctx, h.leaderKey).Result()
		for _, p := range h.current() {
			if v != "" && p.schedOwner() == v {
				target = p
			}
		}
		if target == nil {
			time.Sleep(100 * time.Millisecond)
		}
	}
	if target == nil {
		h.t.Logf("chaos-e2e: no live cron leader found; killing a random runner instead")
		cur := h.current()
		h.kill(cur[h.rng.IntN(len(cur))])
		return ""
	}
	// Every other time, wait until the fan-out has recorded its first
	// batch, so the successor resumes from a cursor past the start.
	past := h.leaderKills.Load()%2 == 1
	caught := false
	for try := 0; try < 4 && !caught; try++ {
		// Wake up just before the next whole second, then watch the state.
		next := time.Now().Truncate(time.Second).Add(time.Second - 15*time.Millisecond)
		time.Sleep(time.Until(next))
		for until := time.Now().Add(400 * time.Millisecond); time.Now().Before(until); {
			v, err := h.rdb.HMGet(ctx, h.stateKey, "done", "batches").Result()
			if err == nil && len(v) == 2 && v[0] == "0" && (!past || v[1] != "0" && v[1] != nil) {
				caught = true
				break
			}
		}
	}
	_ = target.cmd.Process.Signal(syscall.SIGKILL)
	<-target.done
	h.kills.Add(1)
	h.leaderKills.Add(1)
	st, _ := h.rdb.HMGet(ctx, h.stateKey, "occ", "done", "part", "submitted").Result()
	mid := len(st) == 4 && st[1] == "0"
	if len(st) != 4 {
		st = make([]any, 4)
	}
	if mid {
		h.midFanOut.Add(1)
	}
	h.logf("killed cron leader %s#%d (fan-out in progress: %v, state occ=%v part=%v submitted=%v)",
		target.id, target.inc, mid, st[0], st[2], st[3])
	h.bg.Go(func() { h.checkGone(target, "SIGKILL (cron leader)") })
	time.Sleep(time.Duration(200+h.rng.IntN(500)) * time.Millisecond)
	h.start(target.id, h.cfgCron)
	if !mid {
		return ""
	}
	occ, _ := st[0].(string)
	if n, err := strconv.ParseInt(occ, 10, 64); err == nil {
		h.mu.Lock()
		h.killed[n] = len(h.epochs) - 1
		h.mu.Unlock()
	}
	return occ
}

// closeEpoch reads what epoch i fired and returns the Redis time it ends.
func (h *chaosHarness) closeEpoch(ep *chaosEpoch, i int) int64 {
	ctx := context.Background()
	now, err := redisNowMs(ctx, h.rdb)
	if err != nil {
		h.t.Fatalf("redis TIME: %v", err)
	}
	if ep.fired, err = firedOccurrences(ctx, h.rdb, chaosPrefix, chaosSchedule); err != nil {
		h.t.Fatalf("fired occurrences: %v", err)
	}
	m, _ := h.rdb.HGetAll(ctx, h.stateKey).Result()
	h.stMu.Lock()
	if st, ok := parseOccState(m); ok {
		h.states[i][st.occ] = st
	}
	ep.states = maps.Clone(h.states[i])
	h.stMu.Unlock()
	return now
}

// restartRedis snapshots what the checker needs from before the data loss,
// kills Redis, starts it again empty, and seeds the bulk subjects again.
func (h *chaosHarness) restartRedis() {
	t := h.t
	ep := h.epochs[len(h.epochs)-1]
	ep.end = h.closeEpoch(ep, len(h.epochs)-1)
	var err error
	if ep.keys, err = readKeys(context.Background(), h.rdb, h.ks, h.keys); err != nil {
		t.Fatalf("snapshot before the Redis restart: %v", err)
	}
	h.stMu.Lock()
	h.states = append(h.states, map[int64]occState{})
	h.stMu.Unlock()
	h.redisDown = time.Now()
	h.rs.Kill()
	time.Sleep(time.Duration(500+h.rng.IntN(500)) * time.Millisecond)
	h.rs.Restart(t)
	h.redisUp = time.Now()
	h.redisRestarts.Add(1)
	h.epochs = append(h.epochs, &chaosEpoch{start: h.seedSubjects()})
	h.logf("Redis restarted empty (down %v); subjects seeded again in %v",
		h.redisUp.Sub(h.redisDown).Round(time.Millisecond), time.Since(h.redisUp).Round(time.Millisecond))
}
