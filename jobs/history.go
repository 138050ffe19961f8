package jobs

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/checkpoints"
	"github.com/tasklease/tasklease/internal/keyspace"
	"github.com/tasklease/tasklease/taskkey"
)

// histSep separates the fields of an encoded history event (lua/lib.lua
// hist_entry): at, event, runId, source, stage, outcome, owner,
// fencingToken, error, and for folded repeats count and lastAt.
const histSep = "\x1f"

// parseEvent decodes one history list entry.
func parseEvent(s string) Event {
	f := strings.Split(s, histSep)
	get := func(i int) string {
		if i < len(f) {
			return f[i]
		}
		return ""
	}
	e := Event{
		At: checkpoints.MillisTime(get(0)), Event: get(1), RunID: get(2), Source: get(3),
		Stage: get(4), Outcome: get(5), Owner: get(6), Error: get(8), Count: 1,
	}
	e.FencingToken, _ = strconv.ParseInt(get(7), 10, 64)
	if n, err := strconv.Atoi(get(9)); err == nil && n > 1 {
		e.Count = n
		e.LastAt = timeField(get(10))
	}
	return e
}

// readHistory returns up to limit events of k, newest first, with the
// counts of coalesced repeats that are still kept in the run record (see
// co_field and n_field in lua/lib.lua). Keys written before compact history keep a
// stream, read as such until it expires.
func readHistory(ctx context.Context, rdb redis.UniversalClient, ks *keyspace.Space, k taskkey.Key, limit int) ([]Event, error) {
	pipe := rdb.Pipeline()
	lr := pipe.LRange(ctx, ks.History(k), int64(-limit), -1)
	co := pipe.HGet(ctx, ks.Task(k), "co")
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	raw := lr.Val()
	if len(raw) == 0 {
		return readLegacyHistory(ctx, rdb, ks, k, limit)
	}
	// Coalesced repeats not yet folded into the list: field c:<source>:<outcome>
	// is "<runId> <event>", n:<source>:<outcome> is "<count> <lastAt>".
	repeats := map[string][2]string{} // event as appended → count, lastAt
	if fields := splitList(co.Val()); len(fields) > 0 {
		all := make([]string, 0, 2*len(fields))
		all = append(all, fields...)
		for _, f := range fields {
			all = append(all, "n"+strings.TrimPrefix(f, "c"))
		}
		vals, err := rdb.HMGet(ctx, ks.Task(k), all...).Result()
		if err != nil {
			return nil, err
		}
		for i := range fields {
			c, _ := vals[i].(string)
			n, _ := vals[len(fields)+i].(string)
			_, ev, ok1 := strings.Cut(c, " ")
			count, last, ok2 := strings.Cut(n, " ")
			if ok1 && ok2 {
				repeats[ev] = [2]string{count, last}
			}
		}
	}
	out := make([]Event, len(raw))
	for i, s := range slices.Backward(raw) {
		e := parseEvent(s)
		if r, ok := repeats[s]; ok {
			if n, err := strconv.Atoi(r[0]); err == nil && n > 1 {
				e.Count, e.LastAt = n, timeField(r[1])
			}
		}
		out[len(raw)-1-i] = e
	}
	return out, nil
}

func readLegacyHistory(ctx context.Context, rdb redis.UniversalClient, ks *keyspace.Space, k taskkey.Key, limit int) ([]Event, error) {
	msgs, err := rdb.XRevRangeN(ctx, ks.LegacyHistory(k), "+", "-", int64(limit)).Result()
	if err != nil && !errors.Is(err, redis.Nil) && !strings.Contains(err.Error(), "WRONGTYPE") {
		return nil, err
	}
	out := make([]Event, len(msgs))
	for i, m := range msgs {
		out[i] = eventFromFields(m.Values)
	}
	return out, nil
}
