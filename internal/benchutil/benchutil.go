// Package benchutil holds helpers for tasklease's benchmarks and
// round-trip tests: a private redis-server with a client sized for the
// benchmark, a go-redis hook that counts the commands (and round trips) a
// client issues, and INFO commandstats snapshots for the server side.
//
// Counting on the client is the reliable way to count round trips: in Redis
// 7 the commands a Lua script runs are counted in INFO commandstats under
// their own names and in total_commands_processed too, so the server cannot
// tell a client's HGETALL from one inside a script (see
// VerifyNestedCounting).
package benchutil

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/lua"
)

// Redis is a private redis-server for one benchmark.
type Redis struct {
	*redistest.Server
	// CallgrindDir holds callgrind's dumps when the server runs under
	// callgrind (CallgrindEnv), else "".
	CallgrindDir string
}

// Server starts a private redis-server (skipping when the binary is missing,
// as redistest does), under callgrind when CallgrindEnv=1.
func Server(tb testing.TB) *Redis {
	tb.Helper()
	r := &Redis{}
	if CallgrindEnabled() {
		r.CallgrindDir = useCallgrind(tb)
	}
	r.Server = redistest.StartServer(tb)
	if cfg := os.Getenv(RedisConfigEnv); cfg != "" {
		c := redis.NewClient(&redis.Options{Addr: r.Addr(), DisableIdentity: true})
		defer c.Close()
		for _, kv := range strings.Split(cfg, ";") {
			k, v, _ := strings.Cut(strings.TrimSpace(kv), " ")
			if err := c.ConfigSet(context.Background(), k, strings.TrimSpace(v)).Err(); err != nil {
				tb.Fatalf("benchutil: CONFIG SET %s %s: %v", k, v, err)
			}
		}
	}
	return r
}

// RedisConfigEnv holds "name value; name value" pairs Server applies with
// CONFIG SET, to measure server tuning, e.g.
// TASKLEASE_BENCH_REDIS_CONFIG="hash-max-listpack-entries 16; latency-tracking no".
const RedisConfigEnv = "TASKLEASE_BENCH_REDIS_CONFIG"

// Client returns a go-redis client for addr with the given pool size (and
// as many idle connections kept warm), closed when tb ends.
func Client(tb testing.TB, addr string, poolSize int, hooks ...redis.Hook) *redis.Client {
	tb.Helper()
	c := redis.NewClient(&redis.Options{
		Addr:            addr,
		PoolSize:        poolSize,
		MinIdleConns:    0,
		MaxIdleConns:    poolSize,
		PoolTimeout:     30 * time.Second,
		DisableIdentity: true,
	})
	for _, h := range hooks {
		c.AddHook(h)
	}
	tb.Cleanup(func() { _ = c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		tb.Fatalf("benchutil: ping %s: %v", addr, err)
	}
	return c
}

// scriptNames are the scripts of package lua, to name EVALSHA digests.
var scriptNames = []string{
	"cancel", "checkpoint_advance", "checkpoint_begin", "checkpoint_progress", "claim", "finish",
	"heartbeat", "lease_acquire", "lease_release", "lease_renew", "retry_move", "submit",
}

var (
	digestsOnce sync.Once
	digests     map[string]string // sha1 → script name
)

// ScriptName returns the tasklease script whose SHA1 is sha, or sha.
func ScriptName(sha string) string {
	digestsOnce.Do(func() {
		digests = make(map[string]string, len(scriptNames))
		for _, n := range scriptNames {
			if s, err := lua.Script(n); err == nil {
				digests[s.Hash()] = n
			}
		}
	})
	if n, ok := digests[strings.ToLower(sha)]; ok {
		return n
	}
	return sha
}

// Counter is a go-redis hook counting the commands a client sends. A script
// run by EVALSHA or FCALL counts as "script:<name>" ("script:claim"), one
// sent as EVAL (a NOSCRIPT fallback) as "eval:<name>". A pipeline counts one
// round trip and one command per queued command. Safe for concurrent use.
type Counter struct {
	mu         sync.Mutex
	cmds       map[string]int64
	roundTrips int64
	watch      string
	watchN     int64
	watchCh    chan struct{}
	watchAt    int64
}

// NewCounter returns an empty Counter.
func NewCounter() *Counter { return &Counter{cmds: map[string]int64{}} }

// CmdName names cmd as the counter does.
func CmdName(cmd redis.Cmder) string {
	name := strings.ToLower(cmd.Name())
	switch name {
	case "evalsha", "evalsha_ro":
		if a := cmd.Args(); len(a) > 1 {
			return "script:" + ScriptName(fmt.Sprint(a[1]))
		}
	case "fcall", "fcall_ro":
		if a := cmd.Args(); len(a) > 1 {
			if n, ok := lua.ScriptOfFunction(fmt.Sprint(a[1])); ok {
				return "script:" + n
			}
			return "script:" + fmt.Sprint(a[1])
		}
	case "eval", "eval_ro":
		if a := cmd.Args(); len(a) > 1 {
			src := fmt.Sprint(a[1])
			return name + ":" + ScriptName(redis.NewScript(src).Hash())
		}
	}
	if fn := cmd.FullName(); fn != "" && strings.Contains(fn, " ") {
		return strings.ToLower(strings.ReplaceAll(fn, " ", "|"))
	}
	return name
}

func (c *Counter) add(names []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.roundTrips++
	for _, n := range names {
		c.cmds[n]++
		if c.watchCh != nil && n == c.watch {
			c.watchN++
			if c.watchN == c.watchAt {
				close(c.watchCh)
				c.watchCh = nil
			}
		}
	}
}

// DialHook implements redis.Hook.
func (c *Counter) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook implements redis.Hook: one command, one round trip.
func (c *Counter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.add([]string{CmdName(cmd)})
		return next(ctx, cmd)
	}
}

// ProcessPipelineHook implements redis.Hook: one round trip for the batch.
func (c *Counter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		names := make([]string, len(cmds))
		for i, cmd := range cmds {
			names[i] = CmdName(cmd)
		}
		c.add(names)
		return next(ctx, cmds)
	}
}

// Reset zeroes the counts.
func (c *Counter) Reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cmds = map[string]int64{}
	c.roundTrips = 0
	c.watchN = 0
}

// Snapshot returns the counts per command name and the round trips.
func (c *Counter) Snapshot() (map[string]int64, int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.cmds), c.roundTrips
}

// WaitFor returns a channel closed once name has been sent n times after
// this call (counting from the last Reset if Reset follows).
func (c *Counter) WaitFor(name string, n int64) <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan struct{})
	c.watch, c.watchAt, c.watchN, c.watchCh = name, n, 0, ch
	return ch
}

// CmdStat is one line of INFO commandstats.
type CmdStat struct {
	Calls int64
	Usec  int64
}

// CommandStats parses INFO commandstats.
func CommandStats(ctx context.Context, rdb redis.UniversalClient) (map[string]CmdStat, error) {
	txt, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return nil, err
	}
	out := map[string]CmdStat{}
	sc := bufio.NewScanner(strings.NewReader(txt))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		name, rest, ok := strings.Cut(line, ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		var st CmdStat
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			switch k {
			case "calls":
				st.Calls, _ = strconv.ParseInt(v, 10, 64)
			case "usec":
				st.Usec, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		out[strings.TrimPrefix(name, "cmdstat_")] = st
	}
	return out, sc.Err()
}

// InfoInt returns one integer field of INFO section.
func InfoInt(ctx context.Context, rdb redis.UniversalClient, section, field string) (int64, error) {
	txt, err := rdb.Info(ctx, section).Result()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(txt, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("benchutil: no %s in INFO %s", field, section)
}

// ResetStats runs CONFIG RESETSTAT.
func ResetStats(ctx context.Context, rdb redis.UniversalClient) error {
	return rdb.ConfigResetStat(ctx).Err()
}

// ScriptCommands are the top-level commands that run scripts, for
// ServerUsec.
var ScriptCommands = []string{"evalsha", "eval", "fcall"}

// ServerUsec sums usec over the top-level commands in names (e.g. "evalsha"):
// the server CPU spent in them, nested script commands included.
func ServerUsec(stats map[string]CmdStat, names ...string) (calls, usec int64) {
	for _, n := range names {
		calls += stats[n].Calls
		usec += stats[n].Usec
	}
	return calls, usec
}

// FormatStats renders stats sorted by usec, for logs.
func FormatStats(stats map[string]CmdStat) string {
	keys := slices.Collect(maps.Keys(stats))
	slices.SortFunc(keys, func(a, b string) int { return int(stats[b].Usec - stats[a].Usec) })
	var sb strings.Builder
	for _, k := range keys {
		st := stats[k]
		per := 0.0
		if st.Calls > 0 {
			per = float64(st.Usec) / float64(st.Calls)
		}
		fmt.Fprintf(&sb, "  %-24s calls=%-9d usec=%-10d usec/call=%.2f\n", k, st.Calls, st.Usec, per)
	}
	return sb.String()
}

// FormatCounts renders client command counts divided by per, for logs.
func FormatCounts(counts map[string]int64, per float64) string {
	keys := slices.Collect(maps.Keys(counts))
	slices.SortFunc(keys, func(a, b string) int {
		if d := counts[b] - counts[a]; d != 0 {
			return int(d)
		}
		return strings.Compare(a, b)
	})
	var sb strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&sb, "  %-32s %8d  %.3f/run\n", k, counts[k], float64(counts[k])/per)
	}
	return sb.String()
}

// VerifyNestedCounting runs one EVAL that calls three commands and reports
// how INFO counts it: the total_commands_processed delta and the
// commandstats calls of the nested SET. In Redis 7.0 both include the
// script's own commands (delta 4 = EVAL + 3, SET counted), which is why
// round trips are counted on the client.
func VerifyNestedCounting(ctx context.Context, rdb redis.UniversalClient) (totalDelta int64, nestedSet int64, err error) {
	if err = ResetStats(ctx, rdb); err != nil {
		return
	}
	before, err := InfoInt(ctx, rdb, "stats", "total_commands_processed")
	if err != nil {
		return
	}
	if err = rdb.Eval(ctx, "redis.call('SET', KEYS[1], '1'); redis.call('GET', KEYS[1]); redis.call('INCR', KEYS[2]); return 1",
		[]string{"benchutil:nested:a", "benchutil:nested:b"}).Err(); err != nil {
		return
	}
	after, err := InfoInt(ctx, rdb, "stats", "total_commands_processed")
	if err != nil {
		return
	}
	// after-before counts the first INFO itself, the EVAL and its 3 commands.
	totalDelta = after - before - 1
	st, err := CommandStats(ctx, rdb)
	if err != nil {
		return
	}
	nestedSet = st["set"].Calls
	rdb.Del(ctx, "benchutil:nested:a", "benchutil:nested:b")
	return totalDelta, nestedSet, nil
}
