package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisServer is the private redis-server of one bench run: a free loopback
// port, no persistence, killed when the bench ends (or dies: Pdeathsig).
type redisServer struct {
	addr string
	cmd  *exec.Cmd
	dir  string
	done chan struct{}
	// callgrind is set when the server runs under valgrind's callgrind
	// (--callgrind): instructions are counted only inside meter windows.
	callgrind bool
	dumps     int // windows dumped to TASKLEASE_BENCH_CALLGRIND_DIR
}

// startRedis launches redis-server on a free loopback port and waits until
// it answers PING. The port is picked by binding :0 and releasing it, so a
// launch that loses the port to another process is retried on a new one.
func startRedis(callgrind bool) (*redisServer, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("redis-server not found on PATH (on Debian: apt-get install redis-server): %w", err)
	}
	if callgrind {
		for _, tool := range []string{"valgrind", "callgrind_control"} {
			if _, err := exec.LookPath(tool); err != nil {
				return nil, fmt.Errorf("--callgrind needs %s on PATH (on Debian: apt-get install valgrind): %w", tool, err)
			}
		}
	}
	dir, err := os.MkdirTemp("", "tasklease-bench-redis-")
	if err != nil {
		return nil, err
	}
	var lastErr error
	for range 4 {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		s, err := launchRedis(bin, dir, port, callgrind)
		if err == nil {
			return s, nil
		}
		lastErr = err
	}
	_ = os.RemoveAll(dir)
	return nil, lastErr
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func launchRedis(bin, dir string, port int, callgrind bool) (*redisServer, error) {
	args := []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", dir}
	cmd := exec.Command(bin, args...)
	ready := 10 * time.Second
	if callgrind {
		// valgrind runs redis-server in its own process (the PID is the
		// server's), counting nothing until a meter switches it on.
		cmd = exec.Command("valgrind", append([]string{"--tool=callgrind", "--instr-atstart=no",
			"--callgrind-out-file=" + filepath.Join(dir, "callgrind.out"), bin}, args...)...)
		ready = 60 * time.Second
	}
	logPath := fmt.Sprintf("%s/redis-%d.log", dir, port)
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Own process group (a ^C is handled by our cleanup, not raced), and
	// SIGKILLed by the kernel if this process dies without cleaning up.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start redis-server: %w", err)
	}
	s := &redisServer{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), cmd: cmd, dir: dir, done: make(chan struct{}), callgrind: callgrind}
	go func() { _ = cmd.Wait(); close(s.done) }()

	c := redis.NewClient(&redis.Options{Addr: s.addr, DisableIdentity: true, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(ready)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return s, nil
		}
		select {
		case <-s.done:
			log, _ := os.ReadFile(logPath)
			return nil, fmt.Errorf("redis-server on port %d exited: %s", port, strings.TrimSpace(string(log)))
		default:
		}
		if time.Now().After(deadline) {
			s.stop()
			return nil, fmt.Errorf("redis-server on port %d did not answer PING within %s: %w", port, ready, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Callgrind counts the instructions Redis executes: deterministic where CPU
// time on a shared machine is not (a 5 % change is below the noise of
// INFO cpu here, not of an instruction count).

// instrOn zeroes the counters and starts counting.
func (s *redisServer) instrOn() error {
	if err := s.callgrindControl("-z"); err != nil {
		return err
	}
	return s.callgrindControl("-i", "on")
}

// instrOff stops counting and returns the instructions counted since
// instrOn (a dump's "totals:" line).
func (s *redisServer) instrOff() (int64, error) {
	if err := s.callgrindControl("-i", "off"); err != nil {
		return 0, err
	}
	before, _ := filepath.Glob(filepath.Join(s.dir, "callgrind.out*"))
	if err := s.callgrindControl("-d"); err != nil {
		return 0, err
	}
	after, err := filepath.Glob(filepath.Join(s.dir, "callgrind.out*"))
	if err != nil {
		return 0, err
	}
	for _, f := range after {
		if slices.Contains(before, f) {
			continue
		}
		b, err := os.ReadFile(f)
		_ = os.Remove(f)
		if err != nil {
			return 0, err
		}
		if keep := os.Getenv("TASKLEASE_BENCH_CALLGRIND_DIR"); keep != "" {
			// for callgrind_annotate: one dump per measured window, in order
			s.dumps++
			if err := os.WriteFile(filepath.Join(keep, fmt.Sprintf("window-%02d.callgrind", s.dumps)), b, 0o644); err != nil {
				return 0, err
			}
		}
		for _, l := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(l, "totals: "); ok {
				return strconv.ParseInt(strings.Fields(v)[0], 10, 64)
			}
		}
		return 0, fmt.Errorf("callgrind dump %s has no totals line", f)
	}
	return 0, fmt.Errorf("callgrind_control -d wrote no dump in %s", s.dir)
}

func (s *redisServer) callgrindControl(args ...string) error {
	out, err := exec.Command("callgrind_control", append(args, strconv.Itoa(s.cmd.Process.Pid))...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("callgrind_control %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// stop terminates the server (SIGTERM, SIGKILL after 5 s) and removes its
// directory.
func (s *redisServer) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(5 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
	_ = os.RemoveAll(s.dir)
}

// newClient returns a go-redis client for addr with a pool large enough for
// 50 submitters plus a runner's blocking reads, and the given hooks.
func newClient(addr string, hooks ...redis.Hook) *redis.Client {
	c := redis.NewClient(&redis.Options{
		Addr:            addr,
		PoolSize:        128,
		MaxIdleConns:    128,
		PoolTimeout:     30 * time.Second,
		DisableIdentity: true,
	})
	for _, h := range hooks {
		c.AddHook(h)
	}
	return c
}

// tripCounter is a go-redis hook counting client round trips: one per
// command sent alone, one per pipeline, whatever it holds. Blocking reads
// count like any other command.
type tripCounter struct {
	trips atomic.Int64
	cmds  atomic.Int64
	// fns, when set (--commands), counts the FCALLs sent by function name
	// (name → *atomic.Int64): INFO commandstats has one line for them all.
	fns *sync.Map
}

func (c *tripCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *tripCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.trips.Add(1)
		c.cmds.Add(1)
		if c.fns != nil {
			c.countFcall(cmd)
		}
		return next(ctx, cmd)
	}
}

func (c *tripCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.trips.Add(1)
		c.cmds.Add(int64(len(cmds)))
		if c.fns != nil {
			for _, cmd := range cmds {
				c.countFcall(cmd)
			}
		}
		return next(ctx, cmds)
	}
}

func (c *tripCounter) countFcall(cmd redis.Cmder) {
	args := cmd.Args()
	if len(args) < 2 || cmd.Name() != "fcall" {
		return
	}
	fn, _ := args[1].(string)
	n, ok := c.fns.Load(fn)
	if !ok {
		n, _ = c.fns.LoadOrStore(fn, new(atomic.Int64))
	}
	n.(*atomic.Int64).Add(1)
}

// fcalls returns the FCALLs counted so far by function (nil unless
// counting).
func (c *tripCounter) fcalls() map[string]int64 {
	if c.fns == nil {
		return nil
	}
	out := map[string]int64{}
	c.fns.Range(func(k, v any) bool {
		out[k.(string)] = v.(*atomic.Int64).Load()
		return true
	})
	return out
}

// info returns the fields of one INFO section.
func info(ctx context.Context, rdb redis.UniversalClient, section string) (map[string]string, error) {
	txt, err := rdb.Info(ctx, section).Result()
	if err != nil {
		return nil, fmt.Errorf("INFO %s: %w", section, err)
	}
	out := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(txt))
	for sc.Scan() {
		if k, v, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":"); ok {
			out[k] = v
		}
	}
	return out, sc.Err()
}

// serverSnapshot is what a measurement reads from Redis before and after:
// the server's CPU time and the commands it executed.
type serverSnapshot struct {
	cpu   time.Duration // used_cpu_user + used_cpu_sys
	sys   time.Duration // used_cpu_sys alone: the kernel's share (socket I/O)
	calls int64         // sum of calls over INFO commandstats
	byCmd map[string]cmdStat
}

// cmdStat is one command's line of INFO commandstats.
type cmdStat struct {
	calls int64
	usec  int64 // time Redis spent in it; a script's own line includes its commands'
}

// takeSnapshot reads INFO cpu and INFO commandstats. Commands run inside
// Lua scripts are counted in commandstats under their own names (Redis 7),
// so calls counts the work a script does, not client requests; client
// round trips are counted with tripCounter.
func takeSnapshot(ctx context.Context, rdb redis.UniversalClient) (serverSnapshot, error) {
	s := serverSnapshot{byCmd: map[string]cmdStat{}}
	cpu, err := info(ctx, rdb, "cpu")
	if err != nil {
		return s, err
	}
	for _, k := range []string{"used_cpu_user", "used_cpu_sys"} {
		f, err := strconv.ParseFloat(cpu[k], 64)
		if err != nil {
			return s, fmt.Errorf("INFO cpu %s=%q: %w", k, cpu[k], err)
		}
		s.cpu += time.Duration(f * float64(time.Second))
		if k == "used_cpu_sys" {
			s.sys = time.Duration(f * float64(time.Second))
		}
	}
	stats, err := info(ctx, rdb, "commandstats")
	if err != nil {
		return s, err
	}
	for k, v := range stats {
		// The bench's own INFO and CONFIG RESETSTAT are not the systems' work.
		// (Redis 7 names subcommands: cmdstat_config|resetstat.)
		if !strings.HasPrefix(k, "cmdstat_") || k == "cmdstat_info" || strings.HasPrefix(k, "cmdstat_config") {
			continue
		}
		var cs cmdStat
		for _, kv := range strings.Split(v, ",") {
			if n, ok := strings.CutPrefix(kv, "calls="); ok {
				cs.calls, _ = strconv.ParseInt(n, 10, 64)
			} else if n, ok := strings.CutPrefix(kv, "usec="); ok {
				cs.usec, _ = strconv.ParseInt(n, 10, 64)
			}
		}
		s.calls += cs.calls
		s.byCmd[strings.TrimPrefix(k, "cmdstat_")] = cs
	}
	return s, nil
}

// resetServer empties the database and zeroes the command statistics
// between measurements.
func resetServer(ctx context.Context, rdb redis.UniversalClient) error {
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		return fmt.Errorf("FLUSHALL: %w", err)
	}
	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		return fmt.Errorf("CONFIG RESETSTAT: %w", err)
	}
	return nil
}

// memoryOfAllKeys sums MEMORY USAGE key SAMPLES 0 (exact, every element)
// over a SCAN of every key in the database (a key SCAN returns twice is
// counted once), in total and by kind of key (keyKind).
func memoryOfAllKeys(ctx context.Context, rdb redis.UniversalClient) (bytes int64, byKind map[string]int64, err error) {
	byKind = map[string]int64{}
	var cursor uint64
	seen := map[string]bool{}
	for {
		all, next, err := rdb.Scan(ctx, cursor, "*", 1000).Result()
		if err != nil {
			return 0, nil, fmt.Errorf("SCAN: %w", err)
		}
		var page []string
		for _, k := range all {
			if !seen[k] {
				seen[k] = true
				page = append(page, k)
			}
		}
		if len(page) > 0 {
			pipe := rdb.Pipeline()
			cmds := make([]*redis.IntCmd, len(page))
			for i, k := range page {
				cmds[i] = pipe.MemoryUsage(ctx, k, 0)
			}
			if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
				return 0, nil, fmt.Errorf("MEMORY USAGE: %w", err)
			}
			for i, c := range cmds {
				bytes += c.Val() // a key that expired meanwhile answers nil: 0
				byKind[keyKind(page[i])] += c.Val()
			}
		}
		if cursor = next; cursor == 0 {
			return bytes, byKind, nil
		}
	}
}

// keyKind names what a key is, for the memory breakdown: the segment after
// a hash tag ("{tasklease:p3}:task:u1|sync" → "task", "asynq:{default}:t:…"
// → "t"), else the key with its digits dropped.
func keyKind(key string) string {
	if _, rest, ok := strings.Cut(key, "}:"); ok {
		kind, _, _ := strings.Cut(rest, ":")
		return kind
	}
	return strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' {
			return -1
		}
		return r
	}, key)
}
