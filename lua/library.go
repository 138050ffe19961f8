package lua

import (
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"io/fs"
	"sort"
	"strings"
)

// Library is every script of this package as one Redis Functions library
// (Redis ≥ 7.0): lib/'s helpers are defined once, when the library is
// loaded, instead of on every call as an EVAL script's prelude is — that
// prelude was the largest fixed cost of a call (about 10 µs of Redis CPU
// for the engine's scripts). Each script's body becomes a function taking
// KEYS and ARGV, with the same contract; callers map a script's EVALSHA
// to FCALL of its function with Function.
//
// The library's name and its functions' names carry a hash of the code, so
// two tasklease versions during a rolling deploy each call their own code.
type Library struct {
	// Name is the library name, "tasklease_<hash>".
	Name string
	// Code is the FUNCTION LOAD payload.
	Code string
	fns  map[string]string // script SHA1 (as EVALSHA names it) → function name
}

// LibraryOptions select a variant of the library.
type LibraryOptions struct {
	// ShardedPubSub publishes views and cancels with SPUBLISH instead of
	// PUBLISH (for Redis Cluster, whose subscribers use SSUBSCRIBE on the
	// channel's slot). The library only: SPUBLISH needs Redis 7, as
	// Functions do, and a script run by EVAL keeps PUBLISH.
	ShardedPubSub bool
	// DueIndex keeps the due index (lib/queues.lua DUE_INDEX,
	// keyspace.Space.Due): on a single Redis server or a Sentinel's
	// primary only. The scripts of SourceWith take it too.
	DueIndex bool
}

// publishLine is lib/publish.lua's definition of the publish command;
// dueIndexLine lib/queues.lua's switch of the due index.
const (
	publishLine  = "local PUBLISH_CMD = 'PUBLISH'"
	dueIndexLine = "local DUE_INDEX = false"
)

// variant applies opts to lib (the helpers): only what scripts run by
// EVAL take too, unless library.
func variant(lib string, opts LibraryOptions, library bool) (string, error) {
	swap := func(line, with string) error {
		if !strings.Contains(lib, line) {
			return fmt.Errorf("lua: lib/ does not define %q", line)
		}
		lib = strings.Replace(lib, line, with, 1)
		return nil
	}
	if opts.ShardedPubSub && library {
		if err := swap(publishLine, "local PUBLISH_CMD = 'SPUBLISH'"); err != nil {
			return "", err
		}
	}
	if opts.DueIndex {
		if err := swap(dueIndexLine, "local DUE_INDEX = true"); err != nil {
			return "", err
		}
	}
	return lib, nil
}

// NewLibrary builds the library of every script.
func NewLibrary(opts LibraryOptions) (*Library, error) {
	plain, err := readLib()
	if err != nil {
		return nil, err
	}
	lib, err := variant(plain, opts, true)
	if err != nil {
		return nil, err
	}
	names, err := fs.Glob(files, "*.lua")
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	bodies := map[string]string{}
	h := sha1.New()
	h.Write([]byte(lib))
	for _, f := range names {
		b, err := files.ReadFile(f)
		if err != nil {
			return nil, err
		}
		name := strings.TrimSuffix(f, ".lua")
		bodies[name] = string(b)
		fmt.Fprintf(h, "\x00%s\x00%s", name, b)
	}
	version := hex.EncodeToString(h.Sum(nil))[:12]
	l := &Library{Name: "tasklease_" + version, fns: map[string]string{}}
	var code strings.Builder
	fmt.Fprintf(&code, "#!lua name=%s\n%s\n", l.Name, lib)
	for _, f := range names {
		name := strings.TrimSuffix(f, ".lua")
		body, ok := bodies[name]
		if !ok {
			continue
		}
		// Callers name a script by its EVALSHA hash: the one SourceWith
		// gives for the same options.
		src, err := SourceWith(name, opts)
		if err != nil {
			return nil, err
		}
		fn := "tasklease_" + name + "_" + version
		// The body sees KEYS and ARGV as the parameters of its function, as
		// it sees them as globals when run by EVAL.
		fmt.Fprintf(&code, "\n-- %s.lua\nredis.register_function(%q, function(KEYS, ARGV)\nbind()\n%s\nend)\n", name, fn, body)
		l.fns[sha1Hex(src)] = fn
	}
	l.Code = code.String()
	return l, nil
}

// Function returns the function that runs the script whose EVALSHA hash is
// sha.
func (l *Library) Function(sha string) (string, bool) {
	fn, ok := l.fns[sha]
	return fn, ok
}

func sha1Hex(s string) string {
	sum := sha1.Sum([]byte(s))
	return hex.EncodeToString(sum[:])
}

// ScriptOfFunction returns the script a library function runs
// ("tasklease_claim_<version>" → "claim"); ok is false for another name.
func ScriptOfFunction(fn string) (name string, ok bool) {
	rest, ok := strings.CutPrefix(fn, "tasklease_")
	if !ok {
		return "", false
	}
	i := strings.LastIndexByte(rest, '_')
	if i <= 0 {
		return "", false
	}
	return rest[:i], true
}
