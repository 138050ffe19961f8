package groupcommit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/lua"
)

// Script calls go to Redis as FCALL of the Client's library (Redis ≥ 7.0)
// when Redis has FUNCTION, else as EVALSHA: miniredis and Redis 6 have no
// FUNCTION. Which one is decided once, by the first call, when it loads
// the library.

// fnState is what the Client knows about FUNCTION on its Redis.
type fnState int32

const (
	fnUnknown  fnState = iota // not loaded yet (or the last load failed)
	fnLoaded                  // FCALL: the library is loaded
	fnEvalOnly                // no FUNCTION command: EVALSHA
)

// functions holds the library and its state; safe for concurrent use.
type functions struct {
	lib     *lua.Library
	state   atomic.Int32 // fnState
	loading sync.Mutex   // one load at a time
	retryAt atomic.Int64 // unix ns: after a failed load, none before this
}

// loadRetry is how long calls use EVALSHA after a failed load before one
// of them tries to load the library again.
const loadRetry = time.Second

// fnCurrent returns the state, loading the library first when it is
// unknown. It never waits for another goroutine's load, and after a failed
// load (Redis unreachable) it does not try again for loadRetry: meanwhile
// calls go out as EVALSHA, which works on any Redis.
func (c *Client) fnCurrent(ctx context.Context) fnState {
	f := c.fns
	if f == nil {
		return fnEvalOnly
	}
	if s := fnState(f.state.Load()); s != fnUnknown {
		return s
	}
	if time.Now().UnixNano() < f.retryAt.Load() || !f.loading.TryLock() {
		return fnUnknown
	}
	_ = c.loadLocked(ctx)
	f.loading.Unlock()
	return fnState(f.state.Load())
}

// LoadFunctions loads the library on every master (a library already
// loaded is kept), e.g. after a Redis restart lost it or a Cluster gained a
// master. Without FUNCTION on the server the Client switches to EVALSHA
// for good and LoadFunctions returns nil.
func (c *Client) LoadFunctions(ctx context.Context) error {
	f := c.fns
	if f == nil {
		return nil
	}
	f.loading.Lock()
	defer f.loading.Unlock()
	return c.loadLocked(ctx)
}

// loadLocked loads the library; the caller holds f.loading.
func (c *Client) loadLocked(ctx context.Context) error {
	f := c.fns
	load := func(ctx context.Context, node redis.Cmdable) error {
		err := node.FunctionLoad(ctx, f.lib.Code).Err()
		if err != nil && strings.Contains(err.Error(), "already exists") {
			return nil
		}
		return err
	}
	var err error
	if cc, ok := c.rdb.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error { return load(ctx, node) })
	} else {
		err = load(ctx, c.rdb)
	}
	switch {
	case err == nil:
		f.state.Store(int32(fnLoaded))
	case isUnknownCommand(err):
		f.state.Store(int32(fnEvalOnly))
		err = nil
	default:
		f.state.Store(int32(fnUnknown)) // EVALSHA until a later load succeeds
		f.retryAt.Store(time.Now().Add(loadRetry).UnixNano())
		err = fmt.Errorf("groupcommit: load functions: %w", err)
	}
	return err
}

// isUnknownCommand reports an error answering a command the server does
// not have.
func isUnknownCommand(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && strings.Contains(strings.ToLower(rerr.Error()), "unknown command")
}

// IsFunctionMissing reports the answer to an FCALL of a function the node
// does not have (its library was lost: a restart without persistence,
// FUNCTION FLUSH, a new Cluster master). The call did not run; load the
// library (LoadFunctions) and send it again.
func IsFunctionMissing(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && strings.Contains(rerr.Error(), "Function not found")
}

// ScriptCmd returns the command running the script whose SHA1 is sha with
// keys and args, to give to Do: FCALL of its library function when Redis
// has FUNCTION, else EVALSHA (answered NOSCRIPT when the script is not
// loaded).
func (c *Client) ScriptCmd(ctx context.Context, sha string, keys []string, args ...any) *redis.Cmd {
	if c.fnCurrent(ctx) == fnLoaded {
		if fn, ok := c.fns.lib.Function(sha); ok {
			return redis.NewCmd(ctx, evalArgs("fcall", fn, keys, args)...)
		}
	}
	return redis.NewCmd(ctx, evalArgs("evalsha", sha, keys, args)...)
}

// FunctionsLoaded reports whether script calls go out as FCALL of the
// library (loading it first when that is not known yet).
func (c *Client) FunctionsLoaded(ctx context.Context) bool {
	return c.fnCurrent(ctx) == fnLoaded
}
