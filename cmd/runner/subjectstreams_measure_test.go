package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// runnerSample is the runner's memory and goroutines at one moment.
type runnerSample struct {
	rss, heapInuse, stackInuse float64
	goroutines                 int
	gcs                        int64
}

// sampleRunner reads VmRSS from /proc and the Go figures from /metrics.
// It asks for gzip, as Prometheus does, which makes each scrape allocate a
// compressor (about a MiB) in the runner: afterGC relies on that.
func sampleRunner(t *testing.T, base string, pid int) runnerSample {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, base+"/metrics", nil)
	req.Header.Set("Accept-Encoding", "gzip")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body io.Reader = resp.Body
	if resp.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		body = zr
	}
	m := map[string]float64{}
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if !ok || strings.HasPrefix(name, "#") {
			continue
		}
		if f, err := strconv.ParseFloat(strings.TrimSpace(val), 64); err == nil {
			m[name] = f
		}
	}
	for _, k := range []string{"go_memstats_heap_inuse_bytes", "go_memstats_stack_inuse_bytes", "go_goroutines", "go_gc_duration_seconds_count"} {
		if _, ok := m[k]; !ok {
			t.Fatalf("/metrics has no %s", k)
		}
	}
	return runnerSample{rss: procRSS(t, pid), heapInuse: m["go_memstats_heap_inuse_bytes"], stackInuse: m["go_memstats_stack_inuse_bytes"],
		goroutines: int(m["go_goroutines"]), gcs: int64(m["go_gc_duration_seconds_count"])}
}

// settledRunner polls until two samples 250 ms apart agree: the same
// goroutine count, at least streams*2 of them above nothing, and heap in
// use within 1 %.
func settledRunner(t *testing.T, base string, pid, streams int) runnerSample {
	t.Helper()
	prev := sampleRunner(t, base, pid)
	deadline := time.Now().Add(60 * time.Second)
	for {
		time.Sleep(250 * time.Millisecond) // sampling interval
		cur := sampleRunner(t, base, pid)
		if cur.goroutines == prev.goroutines && cur.goroutines >= streams &&
			abs(cur.heapInuse-prev.heapInuse) <= 0.01*prev.heapInuse {
			return cur
		}
		if time.Now().After(deadline) {
			t.Logf("runner did not settle within 60s: %+v then %+v", prev, cur)
			return cur
		}
		prev = cur
	}
}

// afterGC returns a settled sample taken after a GC cycle that began
// after gcs cycles had completed, once the sweep that follows it has
// freed the dead objects' spans: the heap in use is then about the live
// heap. Nothing else allocates much in the idle runner, so it scrapes
// /metrics until a cycle comes (each scrape allocates about a MiB).
func afterGC(t *testing.T, base string, pid, streams int, gcs int64) runnerSample {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		s := sampleRunner(t, base, pid)
		if s.gcs > gcs+1 { // cycle gcs+1 may have begun before gcs was read
			return settledRunner(t, base, pid, streams)
		}
		if time.Now().After(deadline) {
			t.Logf("no GC cycle in the runner within 60s: the heap figures \"after GC\" are without one")
			return s
		}
	}
}

func abs(f float64) float64 {
	if f < 0 {
		return -f
	}
	return f
}

// procRSS is the process's resident set, from /proc/<pid>/status.
func procRSS(t *testing.T, pid int) float64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64)
			if err != nil {
				t.Fatalf("VmRSS %q: %v", v, err)
			}
			return kb * 1024
		}
	}
	t.Fatal("no VmRSS in /proc/<pid>/status")
	return 0
}

// runnerCPU is the process's user + system CPU time so far, from
// /proc/<pid>/stat (in USER_HZ ticks, 100 a second on Linux).
func runnerCPU(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := bytes.Cut(b, []byte(") "))
	f := strings.Fields(string(after))
	if !ok || len(f) < 13 {
		t.Fatalf("/proc/%d/stat: %q", pid, b)
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		t.Fatalf("/proc/%d/stat: %q", pid, b)
	}
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// subscribeCalls is how many (S|P)SUBSCRIBE commands Redis has served.
func subscribeCalls(t *testing.T, rdb *redis.Client) int64 {
	t.Helper()
	info, err := rdb.Info(t.Context(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, l := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(l), ":calls=")
		if !ok || !slices.Contains([]string{"cmdstat_subscribe", "cmdstat_ssubscribe", "cmdstat_psubscribe"}, name) {
			continue
		}
		calls, _, _ := strings.Cut(rest, ",")
		c, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			t.Fatalf("commandstats line %q", l)
		}
		n += c
	}
	return n
}

// pubsubClients counts Redis's client connections subscribed to anything.
func pubsubClients(t *testing.T, rdb *redis.Client) int {
	t.Helper()
	list, err := rdb.ClientList(t.Context()).Result()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, l := range strings.Split(strings.TrimSpace(list), "\n") {
		for _, f := range strings.Fields(l) {
			k, v, _ := strings.Cut(f, "=")
			if (k == "sub" || k == "psub" || k == "ssub") && v != "0" {
				n++
				break
			}
		}
	}
	return n
}
