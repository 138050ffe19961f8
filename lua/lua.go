// Package lua holds tasklease's Redis Lua scripts.
//
// Each NAME.lua file is headed by its KEYS / ARGV / return contract. Scripts
// share the helpers of lib/ (lease grant and check, history, publish,
// checkpoint hand-over): Script prepends to the body the helpers it uses,
// so the logic of e.g. a lease grant exists once even though several
// scripts grant leases. Only the helpers a script reaches are included:
// Redis runs a script's whole chunk on every call, and defining all of
// lib/'s functions cost about 2 µs per call.
//
// On Redis 7 the engine runs the scripts as Redis Functions instead
// (NewLibrary: all of them in one library, lib/ defined once at load),
// which removes the helpers' cost from every call. Elsewhere (miniredis,
// Redis 6, the standalone leasing and cron scripts) scripts run through
// go-redis (*redis.Script).Run: EVALSHA, falling back to EVAL when Redis
// answers NOSCRIPT, so a SCRIPT FLUSH or a Redis restart in the middle of
// work costs one extra round trip and breaks nothing.
package lua

import (
	"embed"
	"fmt"
	"regexp"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

//go:embed *.lua lib/*.lua
var files embed.FS

// libFiles are the helpers' files, in the order they are defined: each
// uses only those of the files before it (a Lua local is visible after its
// definition).
var libFiles = []string{
	"lib/base.lua",
	"lib/history.lua",
	"lib/publish.lua",
	"lib/checkpoints.lua",
	"lib/queues.lua",
	"lib/runs.lua",
	"lib/submitting.lua",
	"lib/claiming.lua",
	"lib/limiters.lua",
}

// readLib returns the helpers: libFiles as one chunk, blank-line separated.
func readLib() (string, error) {
	var b strings.Builder
	for _, f := range libFiles {
		code, err := files.ReadFile(f)
		if err != nil {
			return "", fmt.Errorf("lua: read %s: %w", f, err)
		}
		b.Write(code)
		b.WriteString("\n\n")
	}
	return b.String(), nil
}

// Source returns the full source of script name (without ".lua"), the
// helpers it uses included.
func Source(name string) (string, error) { return SourceWith(name, LibraryOptions{}) }

// sourceKey names one script variant in sources.
type sourceKey struct {
	name string
	opts LibraryOptions
}

// sources memoises SourceWith: the scripts are embedded and never change,
// and composing one scans the helpers with regular expressions (about a
// millisecond a script), which a process making many registries — a test
// suite, the fleet bench's 100 pods — paid for every one.
var sources sync.Map // sourceKey → string

// SourceWith is Source of the variant opts selects (LibraryOptions; of
// them, what a script run by EVAL takes).
func SourceWith(name string, opts LibraryOptions) (string, error) {
	k := sourceKey{name, opts}
	if src, ok := sources.Load(k); ok {
		return src.(string), nil
	}
	src, err := composeSource(name, opts)
	if err == nil {
		sources.Store(k, src)
	}
	return src, err
}

func composeSource(name string, opts LibraryOptions) (string, error) {
	plain, err := readLib()
	if err != nil {
		return "", err
	}
	lib, err := variant(plain, opts, false)
	if err != nil {
		return "", err
	}
	if strings.ContainsRune(name, '/') { // lib/'s files are helpers, not scripts
		return "", fmt.Errorf("lua: unknown script %q", name)
	}
	body, err := files.ReadFile(name + ".lua")
	if err != nil {
		return "", fmt.Errorf("lua: unknown script %q: %w", name, err)
	}
	return compose(lib, name, string(body))
}

// compose is script name: the helpers of lib its body uses, then the body,
// which first calls bind (lib/base.lua), the upvalues every helper calls
// through.
func compose(lib, name, body string) (string, error) {
	body = "bind()\n" + body
	prelude, err := helpersFor(lib, body)
	if err != nil {
		return "", err
	}
	return prelude + "\n-- " + name + ".lua\n" + body, nil
}

// topDef matches a helper's definition in lib/: a top-level local.
var topDef = regexp.MustCompile(`(?m)^local (?:function )?([A-Za-z_][A-Za-z0-9_]*)`)

var ident = regexp.MustCompile(`[A-Za-z_][A-Za-z0-9_]*`)

// helpersFor returns the paragraphs of lib (blank-line separated: a
// comment and one top-level definition; a paragraph of comments only goes
// with the next one) that body uses, directly or through other helpers,
// in lib's order.
func helpersFor(lib, body string) (string, error) {
	paras := strings.Split(strings.TrimSpace(lib), "\n\n")
	defines := make([]string, len(paras)) // "" for comment-only paragraphs
	where := map[string]int{}
	for i, p := range paras {
		code := uncommented(p)
		if strings.TrimSpace(code) == "" {
			continue
		}
		ms := topDef.FindAllStringSubmatch(code, -1)
		if ms == nil || !strings.HasPrefix(strings.TrimLeft(code, "\n"), "local ") {
			return "", fmt.Errorf("lua: lib/ paragraph %d does not start with a top-level definition: %.60q", i+1, code)
		}
		defines[i] = ms[0][1]
		for _, m := range ms { // a paragraph may define more than one (bind's)
			where[m[1]] = i
		}
	}
	need := make([]bool, len(paras))
	var visit func(text string)
	visit = func(text string) {
		for _, w := range ident.FindAllString(uncommented(text), -1) {
			if i, ok := where[w]; ok && !need[i] {
				need[i] = true
				visit(paras[i])
			}
		}
	}
	visit(body)
	var b strings.Builder
	for i, p := range paras {
		take := need[i]
		if defines[i] == "" { // comments: kept with the paragraph they introduce
			for j := i + 1; j < len(paras); j++ {
				if defines[j] != "" {
					take = need[j]
					break
				}
			}
		}
		if take {
			b.WriteString(p)
			b.WriteString("\n\n")
		}
	}
	return b.String(), nil
}

// uncommented drops Lua line comments (lib/ has no long comments).
func uncommented(s string) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		if j := strings.Index(l, "--"); j >= 0 {
			lines[i] = l[:j]
		}
	}
	return strings.Join(lines, "\n")
}

// Script returns script name ready to run.
func Script(name string) (*redis.Script, error) { return ScriptWith(name, LibraryOptions{}) }

// ScriptWith is Script of the variant opts selects (SourceWith).
func ScriptWith(name string, opts LibraryOptions) (*redis.Script, error) {
	src, err := SourceWith(name, opts)
	if err != nil {
		return nil, err
	}
	return redis.NewScript(src), nil
}

// MustScript is Script for tasklease's own packages, which name their
// scripts with constants when they are constructed; it panics on an unknown
// name, which every package's tests would catch at once.
func MustScript(name string) *redis.Script { return MustScriptWith(name, LibraryOptions{}) }

// MustScriptWith is MustScript of the variant opts selects (SourceWith).
func MustScriptWith(name string, opts LibraryOptions) *redis.Script {
	s, err := ScriptWith(name, opts)
	if err != nil {
		panic(err)
	}
	return s
}
