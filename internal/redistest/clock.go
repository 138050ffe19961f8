package redistest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"time"
)

// Clock shifts the wall clock of the redis-servers started with it
// (StartServerWithClock) while they run: Redis TIME, key expiry and
// everything else Redis dates by gettimeofday / clock_gettime(CLOCK_REALTIME)
// / time move by the offset; the monotonic clock does not. It is an
// LD_PRELOAD shim built by the test with gcc, never shipped: Debian's
// libfaketime aborts at start under its jemalloc-linked redis-server
// ("unexpected recursive calls to clock_gettime()"), so the shim uses raw
// system calls and allocates nothing. It reads the offset from a file at
// most once a millisecond.
type Clock struct {
	lib  string // the shim
	file string // the offset in µs, a signed decimal
}

// clockShim is the shim's C source.
const clockShim = `
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static char path[4096];
static long long offset_ns, checked_ns;

// Copied: redis-server writes its process title over the memory its
// environment came in.
__attribute__((constructor)) static void init(void) {
	const char *p = getenv("TASKLEASE_CLOCK_FILE");
	for (int i = 0; p && p[i] && i < (int)sizeof path - 1; i++) path[i] = p[i];
}

static long raw(clockid_t c, struct timespec *ts) { return syscall(SYS_clock_gettime, c, ts); }

static long long offset(void) {
	if (!path[0]) return 0;
	struct timespec m;
	raw(CLOCK_MONOTONIC, &m);
	long long now = m.tv_sec * 1000000000LL + m.tv_nsec;
	long long last = __atomic_load_n(&checked_ns, __ATOMIC_RELAXED);
	if (last != 0 && now - last < 1000000) return __atomic_load_n(&offset_ns, __ATOMIC_RELAXED);
	__atomic_store_n(&checked_ns, now, __ATOMIC_RELAXED);
	int fd = syscall(SYS_openat, AT_FDCWD, path, O_RDONLY);
	if (fd < 0) return __atomic_load_n(&offset_ns, __ATOMIC_RELAXED);
	char buf[32];
	long n = syscall(SYS_read, fd, buf, sizeof buf - 1);
	syscall(SYS_close, fd);
	if (n <= 0) return __atomic_load_n(&offset_ns, __ATOMIC_RELAXED);
	long long v = 0;
	int i = 0, neg = buf[0] == '-';
	for (i = neg; i < n && buf[i] >= '0' && buf[i] <= '9'; i++) v = v * 10 + (buf[i] - '0');
	v = (neg ? -v : v) * 1000;
	__atomic_store_n(&offset_ns, v, __ATOMIC_RELAXED);
	return v;
}

static void shift(struct timespec *ts) {
	long long off = offset();
	if (!off) return;
	long long t = ts->tv_sec * 1000000000LL + ts->tv_nsec + off;
	ts->tv_sec = t / 1000000000LL;
	ts->tv_nsec = t % 1000000000LL;
}

int clock_gettime(clockid_t c, struct timespec *ts) {
	int r = raw(c, ts);
	if (r == 0 && (c == CLOCK_REALTIME || c == CLOCK_REALTIME_COARSE)) shift(ts);
	return r;
}

int gettimeofday(struct timeval *tv, void *tz) {
	struct timespec ts;
	raw(CLOCK_REALTIME, &ts);
	shift(&ts);
	if (tv) {
		tv->tv_sec = ts.tv_sec;
		tv->tv_usec = ts.tv_nsec / 1000;
	}
	return 0;
}

time_t time(time_t *out) {
	struct timespec ts;
	raw(CLOCK_REALTIME, &ts);
	shift(&ts);
	if (out) *out = ts.tv_sec;
	return ts.tv_sec;
}
`

// NewClock builds the shim into the test's temporary directory, with an
// offset of 0. It skips the test when gcc is missing, unless
// TASKLEASE_REQUIRE_REDIS=1 (CI installs gcc).
func NewClock(t T) *Clock {
	t.Helper()
	gcc, missing := lookBinary(t, "gcc")
	if missing != "" {
		t.Skip("redistest: " + missing)
	}
	dir := t.TempDir()
	c := &Clock{lib: filepath.Join(dir, "clockshim.so"), file: filepath.Join(dir, "offset")}
	src := filepath.Join(dir, "clockshim.c")
	if err := os.WriteFile(src, []byte(clockShim), 0o600); err != nil {
		t.Fatalf("redistest: clock shim: %v", err)
	}
	if out, err := exec.Command(gcc, "-shared", "-fPIC", "-O2", "-o", c.lib, src).CombinedOutput(); err != nil {
		t.Fatalf("redistest: build the clock shim: %v\n%s", err, out)
	}
	if err := c.Set(0); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return c
}

// Another returns a clock of its own (offset 0) that shares c's shim: one
// per server, for servers whose clocks differ.
func (c *Clock) Another(t T) *Clock {
	t.Helper()
	n := &Clock{lib: c.lib, file: filepath.Join(t.TempDir(), "offset")}
	if err := n.Set(0); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return n
}

// Offset is the offset Set last wrote.
func (c *Clock) Offset() time.Duration {
	b, err := os.ReadFile(c.file)
	if err != nil {
		return 0
	}
	us, _ := strconv.ParseInt(string(b), 10, 64)
	return time.Duration(us) * time.Microsecond
}

// Set moves the clock of every server started with c to the real clock
// plus d (negative: behind). It takes effect within a millisecond.
func (c *Clock) Set(d time.Duration) error {
	tmp := c.file + ".tmp"
	if err := os.WriteFile(tmp, []byte(strconv.FormatInt(d.Microseconds(), 10)), 0o600); err != nil {
		return fmt.Errorf("clock offset: %w", err)
	}
	if err := os.Rename(tmp, c.file); err != nil { // the shim never reads half a number
		return fmt.Errorf("clock offset: %w", err)
	}
	return nil
}

// env is what a process started with the clock needs in its environment.
func (c *Clock) env() []string {
	return []string{"LD_PRELOAD=" + c.lib, "TASKLEASE_CLOCK_FILE=" + c.file}
}

// StartServerWithClock is StartServerWith whose server runs on clock c.
func StartServerWithClock(t T, c *Clock, args ...string) *Server {
	t.Helper()
	bin := requireBinary(t, "redis-server")
	extra := slices.Clone(args)
	s := newServer(t, bin, t.TempDir(), func(int) []string { return extra })
	s.setClock(c)
	s.startOnFreePort(t, func(t T) int { return FreePort(t) })
	return s
}

// setClock runs s on clock c from its next start (before the first).
func (s *Server) setClock(c *Clock) {
	s.clock = c
	s.env = c.env()
}

// clocks gives servers a Clock each, all sharing the shim the first built.
type clocks struct{ base *Clock }

func (cs *clocks) give(t T, s *Server) {
	t.Helper()
	if cs.base == nil {
		cs.base = NewClock(t)
		s.setClock(cs.base)
		return
	}
	s.setClock(cs.base.Another(t))
}

// Clock is the clock s runs on, or nil (the host's).
func (s *Server) Clock() *Clock { return s.clock }
