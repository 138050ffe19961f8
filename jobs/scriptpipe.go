package jobs

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// scriptCall is one script invocation sent in a pipeline.
type scriptCall struct {
	script *redis.Script
	keys   []string
	args   []any
	cmd    *redis.Cmd // the reply, after evalPipelined
}

// evalPipelined sends calls (and extra, commands that are not scripts) in
// one pipelined round trip of EVALSHAs. After a SCRIPT FLUSH or a Redis
// restart the calls answered NOSCRIPT did nothing, so they are sent again
// once their script is loaded — never a call that ran. The error is the
// first call's error; each call's reply is in its cmd.
func evalPipelined(ctx context.Context, rdb redis.UniversalClient, calls []*scriptCall, extra func(redis.Pipeliner)) error {
	todo := calls
	for attempt := 0; len(todo) > 0; attempt++ {
		pipe := rdb.Pipeline()
		for _, c := range todo {
			c.cmd = c.script.EvalSha(ctx, pipe, c.keys, c.args...)
		}
		if extra != nil && attempt == 0 {
			extra(pipe)
		}
		_, _ = pipe.Exec(ctx) // errors are read per command below
		var again []*scriptCall
		loaded := map[*redis.Script]bool{}
		for _, c := range todo {
			if err := c.cmd.Err(); attempt > 0 || err == nil || !redis.HasErrorPrefix(err, "NOSCRIPT") {
				continue
			}
			if !loaded[c.script] {
				if err := c.script.Load(ctx, rdb).Err(); err != nil {
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
