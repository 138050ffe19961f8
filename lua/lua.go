// Package lua holds tasklease's Redis Lua scripts.
//
// Each NAME.lua file is headed by its KEYS / ARGV / return contract. Scripts
// share the helpers of lib.lua (lease grant and check, history, publish,
// checkpoint hand-over): Script prepends lib.lua to the body, so the logic of
// e.g. a lease grant exists once even though several scripts grant leases.
//
// Scripts run through go-redis (*redis.Script).Run: EVALSHA, falling back to
// EVAL when Redis answers NOSCRIPT, so a SCRIPT FLUSH or a Redis restart in
// the middle of work costs one extra round trip and breaks nothing.
package lua

import (
	"embed"
	"fmt"

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
	return string(lib) + "\n-- " + name + ".lua\n" + string(body), nil
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
