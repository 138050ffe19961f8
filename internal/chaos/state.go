//go:build linux

// Reading what the system under test left behind, read-only: each key's
// Redis state, the cron fan-out state, and the exec stage's log.

package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/keyspace"
	"github.com/tasklease/tasklease/jobs"
	"github.com/tasklease/tasklease/taskkey"
)

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

	// For check 6 (accepted.go): every run the kept history names, and
	// the run record's current run.
	runs     map[string]*runSeen // run id → what the history shows of it
	runID    string              // the record's runId ("" if no record)
	status   jobs.Status         // the record's status
	followUp bool                // the record has a follow-up queued (queue, replace)
}

// runSeen is one run as a key's history shows it.
type runSeen struct {
	first   int    // index (chronological) of the run's oldest kept event
	ended   string // its terminal event (done, failed, cancelled), "" if none kept
	endedAt int64  // when (Redis ms), with ended
}

// seeRun notes history event n (chronological) naming run id.
func (d *keyData) seeRun(id string, n int, event string, at int64) {
	if id == "" {
		return
	}
	if d.runs == nil {
		d.runs = map[string]*runSeen{}
	}
	r := d.runs[id]
	if r == nil {
		r = &runSeen{first: n}
		d.runs[id] = r
	}
	switch jobs.Status(event) {
	case jobs.StatusDone, jobs.StatusFailed, jobs.StatusCancelled:
		r.ended, r.endedAt = event, at
	}
}

// current reports whether id is the record's run and still active.
func (d *keyData) current(id string) bool {
	return id != "" && d.runID == id && d.status.Active()
}

// tokens reports the tokens this key's state names.
func (d *keyData) tokens() []int64 {
	out := []int64{d.lease, d.task}
	for _, g := range d.grants {
		out = append(out, g.token)
	}
	return out
}

// historyReader returns a Registry that reads the histories of keys (it
// knows their scopes; it never runs or submits anything).
func historyReader(rdb redis.UniversalClient, ks *keyspace.Space, keys []taskkey.Key) (*jobs.Registry, error) {
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
		HistoryCap: historyCap, Logger: slog.New(slog.DiscardHandler)})
}

// readKeys reads the history (with coalesced counts), lease and record
// token of every key, and the record's current run, status and follow-up
// flag.
func readKeys(ctx context.Context, rdb redis.UniversalClient, ks *keyspace.Space, keys []taskkey.Key) (map[string]*keyData, error) {
	reg, err := historyReader(rdb, ks, keys)
	if err != nil {
		return nil, fmt.Errorf("history reader: %w", err)
	}
	out := make(map[string]*keyData, len(keys))
	const chunk = 32
	for i := 0; i < len(keys); i += chunk {
		part := keys[i:min(i+chunk, len(keys))]
		pipe := rdb.Pipeline()
		type cmds struct {
			lease *redis.StringCmd
			rec   *redis.SliceCmd // token, runId, status, followUp
		}
		cs := make([]cmds, len(part))
		for j, k := range part {
			cs[j] = cmds{lease: pipe.Get(ctx, ks.Lease(k)), rec: pipe.HMGet(ctx, ks.Task(k), "token", "runId", "status", "followUp")}
		}
		if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("lease and record tokens: %w", err)
		}
		for j, k := range part {
			evs, err := reg.History(ctx, k.Subject(), k.Scope(), historyCap)
			if err != nil {
				return nil, fmt.Errorf("history of %s: %w", k, err)
			}
			slices.Reverse(evs) // chronological
			d := &keyData{events: len(evs)}
			for n, e := range evs {
				at := e.At.UnixMilli()
				if n == 0 {
					d.first = at
				}
				d.seeRun(e.RunID, n, e.Event, at)
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
			rec := make([]string, 4)
			for f, v := range cs[j].rec.Val() {
				if str, ok := v.(string); ok && f < len(rec) {
					rec[f] = str
				}
			}
			d.task, _ = strconv.ParseInt(rec[0], 10, 64)
			d.runID, d.status, d.followUp = rec[1], jobs.Status(rec[2]), rec[3] == "1"
			out[k.String()] = d
		}
	}
	return out, nil
}

// historyLines renders key's last n history events (newest last) for a
// failure message.
func historyLines(ctx context.Context, rdb redis.UniversalClient, ks *keyspace.Space, k taskkey.Key, n int) string {
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

// readOccStates reads the fan-out states Redis holds: the current one and
// those the claims archived (an occurrence claimed and finished between
// two polls is known from the archive).
func (h *harness) readOccStates(ctx context.Context) (map[int64]occState, error) {
	pipe := h.rdb.Pipeline()
	cur := pipe.HGetAll(ctx, h.stateKey)
	past := pipe.LRange(ctx, h.recentKey, 0, -1)
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, err
	}
	out := map[int64]occState{}
	for _, js := range past.Val() {
		var m map[string]string
		if err := json.Unmarshal([]byte(js), &m); err != nil {
			return nil, fmt.Errorf("archived fan-out state %q: %w", js, err)
		}
		if st, ok := parseOccState(m); ok {
			out[st.occ] = st
		}
	}
	if st, ok := parseOccState(cur.Val()); ok {
		out[st.occ] = st
	}
	return out, nil
}

// firedOccurrences lists the occurrences of schedule whose idempotency
// keys exist (both the hash-tagged and the older layout), sorted.
func firedOccurrences(ctx context.Context, rdb redis.UniversalClient, prefix, schedule string) ([]int64, error) {
	seen := map[int64]bool{}
	for _, pat := range []string{"{" + prefix + ":cron:" + schedule + "}:fired:*", prefix + ":cron:fired:" + schedule + ":*"} {
		keys, err := scanKeys(ctx, rdb, pat)
		if err != nil {
			return nil, fmt.Errorf("scan %s: %w", pat, err)
		}
		for _, k := range keys {
			if n, err := strconv.ParseInt(k[strings.LastIndexByte(k, ':')+1:], 10, 64); err == nil {
				seen[n] = true
			}
		}
	}
	out := make([]int64, 0, len(seen))
	for n := range seen {
		out = append(out, n)
	}
	slices.Sort(out)
	return out, nil
}

// scanKeys returns the keys matching pattern. A Cluster client's SCAN
// would see one node only: there every master is scanned.
func scanKeys(ctx context.Context, rdb redis.UniversalClient, pattern string) ([]string, error) {
	var mu sync.Mutex // ForEachMaster calls fn concurrently
	var out []string
	scan := func(ctx context.Context, c redis.Cmdable) error {
		iter := c.Scan(ctx, 0, pattern, 1000).Iterator()
		for iter.Next(ctx) {
			mu.Lock()
			out = append(out, iter.Val())
			mu.Unlock()
		}
		return iter.Err()
	}
	if cc, ok := rdb.(*redis.ClusterClient); ok {
		err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return scan(ctx, c) })
		return out, err
	}
	return out, scan(ctx, rdb)
}

// redisNowMs is Redis TIME in milliseconds.
// Right after a failover the client may still be on its way to the new
// primary (a Sentinel client follows +switch-master after the Sentinels
// answer), so a failing TIME is asked again for up to redisNowPatience.
func redisNowMs(ctx context.Context, rdb redis.UniversalClient) (int64, error) {
	deadline := time.Now().Add(redisNowPatience)
	for {
		t, err := rdb.Time(ctx).Result()
		if err == nil {
			return t.UnixMilli(), nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return 0, fmt.Errorf("redis TIME: %w", err)
		}
		select {
		case <-ctx.Done():
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// redisNowPatience bounds redisNowMs's retries.
const redisNowPatience = 15 * time.Second

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
		return nil, fmt.Errorf("exec log: %w", err)
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
