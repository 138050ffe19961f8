// Package lua holds tasklease's Redis Lua scripts.
//
// Each NAME.lua file is headed by its KEYS / ARGV / return contract. Scripts
// share the helpers of lib.lua (lease grant and check, history, publish,
// checkpoint hand-over): Script prepends to the body the helpers it uses,
// so the logic of e.g. a lease grant exists once even though several
// scripts grant leases. Only the helpers a script reaches are included:
// Redis runs a script's whole chunk on every call, and defining all of
// lib.lua's functions cost about 2 µs per call.
//
// On Redis 7 the engine runs the scripts as Redis Functions instead
// (NewLibrary: all of them in one library, lib.lua defined once at load),
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

	"github.com/redis/go-redis/v9"
)

//go:embed *.lua
var files embed.FS

const libFile = "lib.lua"

// Source returns the full source of script name (without ".lua"), lib
// included.
func Source(name string) (string, error) {
	lib, err := files.ReadFile(libFile)
	if err != nil {
		return "", fmt.Errorf("lua: read %s: %w", libFile, err)
	}
	body, err := files.ReadFile(name + ".lua")
	if err != nil {
		return "", fmt.Errorf("lua: unknown script %q: %w", name, err)
	}
	return compose(string(lib), name, string(body))
}

// compose is script name: the helpers of lib its body uses, then the body,
// which first calls bind (lib.lua), the upvalues every helper calls
// through.
func compose(lib, name, body string) (string, error) {
	body = "bind()\n" + body
	prelude, err := helpersFor(lib, body)
	if err != nil {
		return "", err
	}
	return prelude + "\n-- " + name + ".lua\n" + body, nil
}

// topDef matches a helper's definition in lib.lua: a top-level local.
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
			return "", fmt.Errorf("lua: %s paragraph %d does not start with a top-level definition: %.60q", libFile, i+1, code)
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

// uncommented drops Lua line comments (lib.lua has no long comments).
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
func Script(name string) (*redis.Script, error) {
	src, err := Source(name)
	if err != nil {
		return nil, err
	}
	return redis.NewScript(src), nil
}

// MustScript is Script for tasklease's own packages, which name their
// scripts with constants when they are constructed; it panics on an unknown
// name, which every package's tests would catch at once.
func MustScript(name string) *redis.Script {
	s, err := Script(name)
	if err != nil {
		panic(err)
	}
	return s
}
