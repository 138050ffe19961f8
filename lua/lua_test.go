package lua

import (
	"context"
	"io/fs"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/tasklease/tasklease/internal/redistest"
)

var argRef = regexp.MustCompile(`(KEYS|ARGV)\[[0-9]+\]`)

// scriptNames lists every embedded script (the helpers of lib/ are not).
func scriptNames(t *testing.T) []string {
	t.Helper()
	paths, err := fs.Glob(files, "*.lua")
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, p := range paths {
		names = append(names, strings.TrimSuffix(p, ".lua"))
	}
	// The scripts leasing and checkpoints construct with MustScript.
	for _, want := range []string{"lease_acquire", "lease_renew", "lease_release", "checkpoint_begin", "checkpoint_advance", "checkpoint_progress"} {
		found := false
		for _, n := range names {
			found = found || n == want
		}
		if !found {
			t.Errorf("script %s.lua not embedded (have %v)", want, names)
		}
	}
	return names
}

func TestScriptHeaders(t *testing.T) {
	for _, name := range scriptNames(t) {
		body, err := files.ReadFile(name + ".lua")
		if err != nil {
			t.Fatal(err)
		}
		// The header is the leading run of comment lines.
		var header strings.Builder
		for _, line := range strings.Split(string(body), "\n") {
			if !strings.HasPrefix(line, "--") {
				break
			}
			header.WriteString(line + "\n")
		}
		h := header.String()
		if h == "" {
			t.Errorf("%s.lua: no header comment", name)
			continue
		}
		for _, word := range []string{"KEYS", "ARGV", "returns"} {
			if !strings.Contains(h, word) {
				t.Errorf("%s.lua: header lacks %q:\n%s", name, word, h)
			}
		}
		// Every KEYS[n] and ARGV[n] the body uses is documented.
		code := strings.TrimPrefix(string(body), h)
		for _, ref := range argRef.FindAllString(code, -1) {
			if !strings.Contains(h, ref) {
				t.Errorf("%s.lua: uses %s, which the header does not document", name, ref)
			}
		}
	}
}

func TestSourceAndScript(t *testing.T) {
	lib, err := readLib()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range scriptNames(t) {
		src, err := Source(name)
		if err != nil {
			t.Fatalf("Source(%s): %v", name, err)
		}
		body, _ := files.ReadFile(name + ".lua")
		if !strings.HasSuffix(src, string(body)) {
			t.Errorf("Source(%s) does not end with %s.lua", name, name)
		}
		// Every helper included is lib/'s text, and every helper the
		// script (or an included helper) calls is included.
		prelude := strings.TrimSuffix(src, string(body))
		for _, m := range topDef.FindAllStringSubmatch(prelude, -1) {
			if !strings.Contains(lib, m[0]) {
				t.Errorf("Source(%s) defines %s, not from lib/", name, m[1])
			}
		}
		defined := map[string]bool{}
		for _, m := range topDef.FindAllStringSubmatch(lib, -1) {
			defined[m[1]] = true
		}
		have := map[string]bool{}
		for _, m := range topDef.FindAllStringSubmatch(prelude, -1) {
			have[m[1]] = true
		}
		for _, w := range ident.FindAllString(uncommented(prelude+string(body)), -1) {
			if defined[w] && !have[w] {
				t.Errorf("Source(%s) uses helper %s without including it", name, w)
			}
		}
		s, err := Script(name)
		if err != nil || s == nil {
			t.Fatalf("Script(%s) = %v, %v", name, s, err)
		}
		if s.Hash() == "" {
			t.Errorf("Script(%s) has no hash", name)
		}
		if MustScript(name).Hash() != s.Hash() {
			t.Errorf("MustScript(%s) differs from Script", name)
		}
	}
}

// TestLibDefinesBeforeUse checks the order of lib/'s helpers: a helper
// that uses one defined later (in a later paragraph of its file or in a
// file later in libFiles) would see a nil global instead, and fail only
// when that line runs.
func TestLibDefinesBeforeUse(t *testing.T) {
	lib, err := readLib()
	if err != nil {
		t.Fatal(err)
	}
	paras := strings.Split(strings.TrimSpace(lib), "\n\n")
	where := map[string]int{}
	for i, p := range paras {
		for _, m := range topDef.FindAllStringSubmatch(uncommented(p), -1) {
			if j, dup := where[m[1]]; dup {
				t.Errorf("%s is defined twice (paragraphs %d and %d)", m[1], j+1, i+1)
			}
			where[m[1]] = i
		}
	}
	if len(where) < 50 {
		t.Fatalf("found %d helpers in lib/, want the library's", len(where))
	}
	for i, p := range paras {
		for _, w := range ident.FindAllString(uncommented(p), -1) {
			if j, ok := where[w]; ok && j > i {
				t.Errorf("paragraph %d (%.40q) uses %s, defined after it (paragraph %d)", i+1, strings.TrimSpace(uncommented(p)), w, j+1)
			}
		}
	}
}

func TestUnknownScript(t *testing.T) {
	for _, name := range []string{"nope", "lib_missing", "../lua", "lib/base", ""} {
		if src, err := Source(name); err == nil {
			t.Errorf("Source(%q) = %d bytes, want error", name, len(src))
		}
		if s, err := Script(name); err == nil || s != nil {
			t.Errorf("Script(%q) = %v, %v; want nil and an error", name, s, err)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("MustScript of an unknown name did not panic")
		}
	}()
	MustScript("nope")
}

// TestScriptsCompile loads every script into Redis, which compiles it: a
// syntax error in lib/ or a script fails here rather than at first use.
func TestScriptsCompile(t *testing.T) {
	names := scriptNames(t)
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			for _, name := range names {
				s := MustScript(name)
				sha, err := s.Load(ctx, b.Client).Result()
				if err != nil {
					t.Errorf("SCRIPT LOAD %s: %v", name, err)
					continue
				}
				if sha != s.Hash() {
					t.Errorf("SCRIPT LOAD %s: sha %s, want %s", name, sha, s.Hash())
				}
			}
		})
	}
}

// TestNextTokenFollowsCounterOrClock: a grant's token is max(counter + 1,
// Redis TIME in µs) (lib/base.lua next_token, which compares the two as
// decimal strings and converts only when the counter is ahead).
func TestNextTokenFollowsCounterOrClock(t *testing.T) {
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			ctx := context.Background()
			acquire := MustScript("lease_acquire")
			nowUS := func() int64 {
				tm, err := b.Client.Time(ctx).Result()
				if err != nil {
					t.Fatal(err)
				}
				return tm.UnixMicro()
			}
			for i, tc := range []struct {
				name    string
				counter func(now int64) string
				ahead   bool // the token is counter + 1, else the clock's
			}{
				{"counter ahead of the clock", func(now int64) string { return strconv.FormatInt(now+10_000_000_000, 10) }, true},
				{"counter far ahead", func(int64) string { return "9000000000000000" }, true},
				{"counter behind, as long", func(now int64) string { return strconv.FormatInt(now-1_000_000, 10) }, false},
				{"counter behind, shorter", func(int64) string { return "5" }, false},
			} {
				lease, fence := "{nt}:lease:"+strconv.Itoa(i), "{nt}:fence:"+strconv.Itoa(i)
				now := nowUS()
				counter := tc.counter(now)
				if err := b.Client.Set(ctx, fence, counter, 0).Err(); err != nil {
					t.Fatal(err)
				}
				res, err := acquire.Run(ctx, b.Client, []string{lease, fence}, "o", 10_000, 60_000).Slice()
				if err != nil || len(res) != 2 || res[0] != int64(1) {
					t.Fatalf("%s: acquire = %v, %v", tc.name, res, err)
				}
				token := res[1].(int64)
				c, _ := strconv.ParseInt(counter, 10, 64)
				if tc.ahead && token != c+1 {
					t.Errorf("%s: token %d, want the counter's next %d", tc.name, token, c+1)
				}
				if !tc.ahead && (token < now || token <= c) {
					t.Errorf("%s: token %d, want the clock's (≥ %d, above %d)", tc.name, token, now, c)
				}
			}
		})
	}
}
