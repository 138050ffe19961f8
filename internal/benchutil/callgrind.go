package benchutil

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"
)

// CallgrindEnv, when "1", makes Server run redis-server under valgrind's
// callgrind and the benchmarks report the instructions Redis executes per
// op (redis-kinstr/op). Instruction counts do not depend on other load on
// the machine, unlike every timing, so they rank Lua changes reliably on a
// shared box. Redis runs ~50x slower under valgrind: use -benchtime=2000x.
const CallgrindEnv = "TASKLEASE_BENCH_CALLGRIND"

// CallgrindDirEnv names a directory to keep the callgrind dumps in (for
// callgrind_annotate); by default they go to a temporary directory.
const CallgrindDirEnv = "TASKLEASE_BENCH_CALLGRIND_DIR"

// CallgrindEnabled reports whether CallgrindEnv is set.
func CallgrindEnabled() bool { return os.Getenv(CallgrindEnv) == "1" }

// useCallgrind puts a redis-server wrapper that execs the real binary under
// callgrind first on PATH, for the rest of tb. It returns the directory the
// callgrind dumps go to.
func useCallgrind(tb testing.TB) string {
	tb.Helper()
	real, err := exec.LookPath("redis-server")
	if err != nil {
		tb.Skip("benchutil: redis-server not on PATH")
	}
	if _, err := exec.LookPath("valgrind"); err != nil {
		tb.Skipf("benchutil: %s=1 but valgrind is not on PATH", CallgrindEnv)
	}
	dir := tb.TempDir()
	out := os.Getenv(CallgrindDirEnv)
	if out == "" {
		out = filepath.Join(dir, "out")
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		tb.Fatal(err)
	}
	script := fmt.Sprintf("#!/bin/sh\nexec valgrind --tool=callgrind --callgrind-out-file=%s/cg.%%p.out %s \"$@\" 2>>%s/valgrind.log\n",
		out, real, dir)
	if err := os.WriteFile(filepath.Join(dir, "redis-server"), []byte(script), 0o755); err != nil {
		tb.Fatal(err)
	}
	tb.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	return out
}

// Callgrind counts the instructions redis-server executes between Start
// and Instructions, through callgrind_control.
type Callgrind struct {
	pid int
	dir string
}

// StartCallgrind zeroes the counters of the redis-server behind rdb; nil
// (and no error) when the server does not run under callgrind.
func StartCallgrind(ctx context.Context, rdb redis.UniversalClient, dir string) (*Callgrind, error) {
	if dir == "" {
		return nil, nil
	}
	pid, err := InfoInt(ctx, rdb, "server", "process_id")
	if err != nil {
		return nil, err
	}
	c := &Callgrind{pid: int(pid), dir: dir}
	if out, err := exec.Command("callgrind_control", "-z", strconv.Itoa(c.pid)).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("callgrind_control -z: %v: %s", err, out)
	}
	return c, nil
}

// Instructions dumps the counters and returns the instructions executed
// since StartCallgrind.
func (c *Callgrind) Instructions() (int64, error) {
	before, _ := filepath.Glob(filepath.Join(c.dir, fmt.Sprintf("cg.%d.out.*", c.pid)))
	if out, err := exec.Command("callgrind_control", "-d", strconv.Itoa(c.pid)).CombinedOutput(); err != nil {
		return 0, fmt.Errorf("callgrind_control -d: %v: %s", err, out)
	}
	path := filepath.Join(c.dir, fmt.Sprintf("cg.%d.out.%d", c.pid, len(before)+1))
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "summary: "); ok {
			return strconv.ParseInt(strings.Fields(v)[0], 10, 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("benchutil: no summary in %s", path)
}
