package lua_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/lua"
)

// Every script is a function of the library, named after it and the
// library's version, and the library loads into Redis 7.
func TestLibraryHoldsEveryScript(t *testing.T) {
	lib, err := lua.NewLibrary(lua.LibraryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	version := strings.TrimPrefix(lib.Name, "tasklease_")
	for _, name := range []string{"submit", "submit_many", "claim", "finish", "read_next", "reclaim", "heartbeat",
		"cancel", "retry_move", "janitor", "resume", "runner_beat", "checkpoint_begin", "checkpoint_advance", "checkpoint_progress"} {
		s, err := lua.Script(name)
		if err != nil {
			t.Fatal(err)
		}
		fn, ok := lib.Function(s.Hash())
		if !ok || fn != "tasklease_"+name+"_"+version {
			t.Errorf("%s: function %q %v, want tasklease_%s_%s", name, fn, ok, name, version)
		}
		if got, ok := lua.ScriptOfFunction(fn); !ok || got != name {
			t.Errorf("ScriptOfFunction(%q) = %q %v", fn, got, ok)
		}
	}
	if again, _ := lua.NewLibrary(lua.LibraryOptions{}); again.Name != lib.Name || again.Code != lib.Code {
		t.Error("the library is not deterministic")
	}
	sharded, err := lua.NewLibrary(lua.LibraryOptions{ShardedPubSub: true})
	if err != nil {
		t.Fatal(err)
	}
	if sharded.Name == lib.Name || !strings.Contains(sharded.Code, "local PUBLISH_CMD = 'SPUBLISH'") ||
		strings.Contains(lib.Code, "local PUBLISH_CMD = 'SPUBLISH'") {
		t.Errorf("sharded variant %s (of %s) does not publish with SPUBLISH alone", sharded.Name, lib.Name)
	}
	due, err := lua.NewLibrary(lua.LibraryOptions{DueIndex: true})
	if err != nil {
		t.Fatal(err)
	}
	if due.Name == lib.Name || !strings.Contains(due.Code, "local DUE_INDEX = true") || strings.Contains(lib.Code, "local DUE_INDEX = true") {
		t.Errorf("due-index variant %s (of %s) does not keep the index alone", due.Name, lib.Name)
	}
	for _, code := range []string{lib.Code, sharded.Code, due.Code} {
		if strings.Contains(code, "call('PUBLISH'") {
			t.Error("a script publishes without PUBLISH_CMD")
		}
	}

	s := redistest.StartServer(t)
	rdb := s.Client(t)
	ctx := context.Background()
	if err := rdb.FunctionLoad(ctx, lib.Code).Err(); err != nil {
		t.Fatalf("FUNCTION LOAD: %v", err)
	}
	if err := rdb.FunctionLoad(ctx, due.Code).Err(); err != nil {
		t.Fatalf("FUNCTION LOAD of the due-index variant: %v", err)
	}
	if err := rdb.FunctionLoad(ctx, sharded.Code).Err(); err != nil {
		t.Fatalf("FUNCTION LOAD of the sharded variant next to it: %v", err)
	}
	libs, err := rdb.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: lib.Name}).Result()
	if err != nil || len(libs) != 1 {
		t.Fatalf("FUNCTION LIST: %v %v", libs, err)
	}
	// the library's functions: one per script file (lib/ holds helpers, not scripts)
	scripts, _ := filepath.Glob("*.lua")
	if n := len(libs[0].Functions); n != len(scripts) {
		t.Errorf("library has %d functions, want %d (one per script)", n, len(scripts))
	}
}
