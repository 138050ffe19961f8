package groupcommit_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/groupcommit"
	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/lua"
)

// withLibrary returns a real-Redis client and a Client running tasklease's
// library, with the pipeline hook.
func withLibrary(t *testing.T) (*redis.Client, *groupcommit.Client, *pipeHook, *lua.Library) {
	t.Helper()
	lib, err := lua.NewLibrary(lua.LibraryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rdb, gc, h := newHooked(t, groupcommit.Config{Library: lib})
	return rdb, gc, h, lib
}

// heartbeat: a script of the library answering deterministically (any
// will do): read_next on an empty queue, an empty reply whichever way it ran.
func heartbeat(t *testing.T) (*redis.Script, []string, []any) {
	t.Helper()
	s, err := lua.Script("read_next")
	if err != nil {
		t.Fatal(err)
	}
	return s, []string{"{t}:b", "{t}:p", "{t}:bell", "{t}:taken"}, []any{1, "p", "owner\x1f1000\x1f10\x1f0\x1f0"}
}

// On Redis 7 script calls go out as FCALL of the loaded library, and a
// FUNCTION FLUSH costs one reload: the call answered "Function not found"
// did not run and is sent again.
func TestScriptsRunAsFunctionsAndSurviveFunctionFlush(t *testing.T) {
	rdb, gc, h, lib := withLibrary(t)
	ctx := context.Background()
	script, keys, args := heartbeat(t)
	run := func(what string) {
		t.Helper()
		v, err := script.Run(ctx, gc, keys, args...).Result()
		if err != nil && err != redis.Nil {
			t.Fatalf("%s: %v", what, err)
		}
		_ = v
	}
	cmd := gc.ScriptCmd(ctx, script.Hash(), keys, args...)
	if got := fmt.Sprint(cmd.Args()[:2]); !strings.HasPrefix(got, "[fcall tasklease_read_next_") {
		t.Fatalf("ScriptCmd = %v, want FCALL of the library's read_next", cmd.Args())
	}
	libs, err := rdb.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: lib.Name}).Result()
	if err != nil || len(libs) != 1 {
		t.Fatalf("library %s loaded: %v %v", lib.Name, libs, err)
	}
	h.reset()
	run("loaded")
	if got := h.names(); got != "fcall" {
		t.Errorf("a call sent %q, want fcall", got)
	}
	if err := rdb.FunctionFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	h.reset()
	run("after FUNCTION FLUSH")
	if got := h.snapshot(); len(got) != 2 || got[0][0] != "fcall" || got[1][0] != "fcall" {
		t.Errorf("after FUNCTION FLUSH sent %q, want fcall (not found), the reload outside pipelines, fcall", h.names())
	}
	if libs, err := rdb.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: lib.Name}).Result(); err != nil || len(libs) != 1 {
		t.Fatalf("library not loaded again: %v %v", libs, err)
	}
	// Loading again (a second process, a restart) keeps the library.
	if err := gc.LoadFunctions(ctx); err != nil {
		t.Fatalf("second load: %v", err)
	}
}

// Without FUNCTION (miniredis, Redis 6) the Client sends EVALSHA.
func TestScriptsFallBackToEvalShaWithoutFunctions(t *testing.T) {
	m := redistest.StartMini(t)
	rdb := m.Client(t)
	lib, err := lua.NewLibrary(lua.LibraryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	gc, err := groupcommit.New(rdb, groupcommit.Config{Library: lib})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	script, keys, args := heartbeat(t)
	if err := gc.LoadFunctions(ctx); err != nil {
		t.Fatalf("LoadFunctions without FUNCTION = %v, want nil", err)
	}
	if name := gc.ScriptCmd(ctx, script.Hash(), keys, args...).Args()[0]; name != "evalsha" {
		t.Fatalf("ScriptCmd sends %v, want evalsha", name)
	}
	if err := script.Run(ctx, gc, keys, args...).Err(); err != nil && err != redis.Nil {
		t.Fatal(err)
	}
}

// loadCounter counts FUNCTION LOAD attempts.
type loadCounter struct{ n atomic.Int64 }

func (h *loadCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *loadCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if a := cmd.Args(); len(a) > 1 && strings.EqualFold(fmt.Sprint(a[0]), "function") && strings.EqualFold(fmt.Sprint(a[1]), "load") {
			h.n.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (h *loadCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// With Redis unreachable, a call tries to load the library once, then
// calls go out as EVALSHA without trying again for a while (they neither
// wait for nor repeat a load that cannot succeed).
func TestUnreachableRedisFallsBackWithoutRepeatedLoads(t *testing.T) {
	lib, err := lua.NewLibrary(lua.LibraryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t)), MaxRetries: -1,
		DialTimeout: 50 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	h := &loadCounter{}
	rdb.AddHook(h)
	gc, err := groupcommit.New(rdb, groupcommit.Config{Library: lib})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 5 {
		if name := gc.ScriptCmd(ctx, "0123", nil).Args()[0]; name != "evalsha" {
			t.Fatalf("call %d: %v, want evalsha while the library cannot be loaded", i, name)
		}
	}
	if n := h.n.Load(); n != 1 {
		t.Errorf("%d FUNCTION LOAD attempts for 5 calls, want 1", n)
	}
}
