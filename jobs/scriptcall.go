package jobs

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/groupcommit"
)

// scriptCall is one script invocation sent with others in one round trip.
type scriptCall struct {
	script *redis.Script
	keys   []string
	args   []any
	cmd    *redis.Cmd // the reply, after evalGrouped
}

// evalGrouped sends calls together, in one pipeline shared with whatever
// else this process sends meanwhile (groupcommit), as FCALL or EVALSHA
// (groupcommit.Client.ScriptCmd). After a SCRIPT FLUSH, FUNCTION FLUSH or
// a Redis restart the calls answered NOSCRIPT or "Function not found" did
// nothing, so they are sent again once their script or the library is
// loaded — never a call that ran. The error is
// the first call's error; each call's reply is in its cmd.
func evalGrouped(ctx context.Context, gc *groupcommit.Client, calls []*scriptCall) error {
	todo := calls
	for attempt := 0; len(todo) > 0; attempt++ {
		cmds := make([]redis.Cmder, len(todo))
		for i, c := range todo {
			c.cmd = gc.ScriptCmd(ctx, c.script.Hash(), c.keys, c.args...)
			cmds[i] = c.cmd
		}
		if err := gc.Do(ctx, cmds...); err != nil {
			return err
		}
		var again []*scriptCall
		loaded := map[*redis.Script]bool{}
		fnsLoaded := false
		for _, c := range todo {
			err := c.cmd.Err()
			if attempt > 0 || err == nil {
				continue
			}
			if groupcommit.IsFunctionMissing(err) {
				if !fnsLoaded {
					if err := gc.LoadFunctions(ctx); err != nil {
						return err
					}
					fnsLoaded = true
				}
				again = append(again, c)
				continue
			}
			if !redis.HasErrorPrefix(err, "NOSCRIPT") {
				continue
			}
			if !loaded[c.script] {
				if err := c.script.Load(ctx, gc).Err(); err != nil {
					return fmt.Errorf("load script: %w", err)
				}
				loaded[c.script] = true
			}
			again = append(again, c)
		}
		todo = again
	}
	for _, c := range calls {
		if err := c.cmd.Err(); err != nil && err != redis.Nil {
			return err
		}
	}
	return nil
}

// evalOne runs one call through evalGrouped and returns its reply as a
// list.
func evalOne(ctx context.Context, gc *groupcommit.Client, c *scriptCall) ([]any, error) {
	if err := evalGrouped(ctx, gc, []*scriptCall{c}); err != nil {
		return nil, err
	}
	return c.cmd.Slice()
}
