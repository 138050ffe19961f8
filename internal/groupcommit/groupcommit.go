// Package groupcommit shares Redis round trips among goroutines: script
// calls made concurrently by many goroutines of one process (submits,
// claims, heartbeats, finishes) are sent together in one pipeline, so Redis
// reads and answers them with one system call each way instead of one per
// call — at high concurrency that is a large part of Redis's CPU time.
//
// There is no timer: a call made while no pipeline is in flight is sent at
// once, so an idle system sees no added latency; calls made while up to
// MaxInFlight pipelines are in flight wait for the next one. Flushing
// goroutines start when work arrives and exit when there is none, so a
// Client needs no Close.
//
// Client implements redis.Scripter: pass it to (*redis.Script).Run, whose
// EVALSHA-then-EVAL fallback works unchanged. Blocking commands must not go
// through it.
package groupcommit

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/lua"
)

// Defaults.
const (
	// MaxInFlightDefault pipelines may be in flight at once: while one
	// waits for Redis, the next one collects calls.
	MaxInFlightDefault = 2
	// MaxBatchDefault bounds the calls of one pipeline.
	MaxBatchDefault = 256
)

// ErrConfig is wrapped by New's errors.
var ErrConfig = errors.New("groupcommit: invalid config")

// Config configures a Client.
type Config struct {
	// MaxInFlight (default MaxInFlightDefault).
	MaxInFlight int
	// MaxBatch (default MaxBatchDefault).
	MaxBatch int
	// Library, when set, runs script calls (ScriptCmd, EvalSha) as FCALL
	// of its functions on a Redis that has FUNCTION (see functions.go).
	Library *lua.Library
}

// Client sends the commands given to it concurrently in shared pipelines.
// Safe for concurrent use.
type Client struct {
	rdb    redis.UniversalClient
	groups *Combiner[[]redis.Cmder]
	fns    *functions // nil: EVALSHA only
}

// New returns a Client on rdb.
func New(rdb redis.UniversalClient, cfg Config) (*Client, error) {
	if rdb == nil {
		return nil, fmt.Errorf("%w: nil redis client", ErrConfig)
	}
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = MaxInFlightDefault
	}
	if cfg.MaxBatch == 0 {
		cfg.MaxBatch = MaxBatchDefault
	}
	if cfg.MaxInFlight < 1 || cfg.MaxBatch < 1 {
		return nil, fmt.Errorf("%w: MaxInFlight %d and MaxBatch %d must be positive", ErrConfig, cfg.MaxInFlight, cfg.MaxBatch)
	}
	c := &Client{rdb: rdb}
	if cfg.Library != nil {
		c.fns = &functions{lib: cfg.Library}
	}
	c.groups = NewCombiner(CombinerConfig{MaxInFlight: cfg.MaxInFlight, MaxBatch: cfg.MaxBatch}, c.flush)
	return c, nil
}

// Do sends cmds in one pipeline, shared with whatever other goroutines
// send meanwhile, and returns when they have been answered (each cmd holds
// its reply and error) or ctx ends. When ctx ends first Do returns its
// cause, and cmds must not be read: a pipeline may still be writing them
// (the commands may still run, as with any request whose reply is not
// awaited).
func (c *Client) Do(ctx context.Context, cmds ...redis.Cmder) error {
	return c.groups.Add(ctx, cmds)
}

func (c *Client) flush(groups [][]redis.Cmder) {
	pipe := c.rdb.Pipeline()
	for _, g := range groups {
		for _, cmd := range g {
			_ = pipe.Process(context.Background(), cmd)
		}
	}
	// Errors are per command; callers read their own.
	_, _ = pipe.Exec(context.Background())
}

// do runs one command through Do. When ctx ends first, the command may
// still be in a pipeline being answered: the caller gets another Cmd
// holding ctx's error, never the one the pipeline writes to.
func (c *Client) do(ctx context.Context, args ...any) *redis.Cmd {
	cmd := redis.NewCmd(ctx, args...)
	if err := c.Do(ctx, cmd); err != nil {
		failed := redis.NewCmd(ctx, args...)
		failed.SetErr(err)
		return failed
	}
	return cmd
}

func evalArgs(name, script string, keys []string, args []any) []any {
	out := make([]any, 0, 3+len(keys)+len(args))
	out = append(out, name, script, len(keys))
	for _, k := range keys {
		out = append(out, k)
	}
	return append(out, args...)
}

// Eval implements redis.Scripter.
func (c *Client) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return c.do(ctx, evalArgs("eval", script, keys, args)...)
}

// EvalSha implements redis.Scripter: the script runs as ScriptCmd says,
// once more after reloading the library if Redis had lost it.
func (c *Client) EvalSha(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	cmd := c.ScriptCmd(ctx, sha1, keys, args...)
	for attempt := 0; ; attempt++ {
		if err := c.Do(ctx, cmd); err != nil {
			failed := redis.NewCmd(ctx, cmd.Args()...)
			failed.SetErr(err)
			return failed
		}
		if attempt > 0 || !IsFunctionMissing(cmd.Err()) {
			return cmd
		}
		if err := c.LoadFunctions(ctx); err != nil {
			return cmd
		}
		cmd = c.ScriptCmd(ctx, sha1, keys, args...)
	}
}

// EvalRO implements redis.Scripter.
func (c *Client) EvalRO(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return c.do(ctx, evalArgs("eval_ro", script, keys, args)...)
}

// EvalShaRO implements redis.Scripter.
func (c *Client) EvalShaRO(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	return c.do(ctx, evalArgs("evalsha_ro", sha1, keys, args)...)
}

// ScriptExists implements redis.Scripter (not grouped).
func (c *Client) ScriptExists(ctx context.Context, hashes ...string) *redis.BoolSliceCmd {
	return c.rdb.ScriptExists(ctx, hashes...)
}

// ScriptLoad implements redis.Scripter (not grouped).
func (c *Client) ScriptLoad(ctx context.Context, script string) *redis.StringCmd {
	return c.rdb.ScriptLoad(ctx, script)
}

var _ redis.Scripter = (*Client)(nil)
