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

// histSep separates the fields of an encoded history event (lua/lib/history.lua
// hist_ev): at, event, runId, source, stage, outcome, owner,
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
	if t := get(7); t != "" {
		e.FencingToken, _ = strconv.ParseInt(t, 10, 64)
	}
	if n := intField(get(9)); n > 1 {
		e.Count = n
		e.LastAt = timeField(get(10))
	}
	return e
}

// readHistory returns up to limit events of k, newest first, with the
// counts of coalesced repeats that are still kept in the run record (see
// co_field and n_field in lua/lib/history.lua). Keys written before compact history keep a
// stream, read as such until it expires.
func readHistory(ctx context.Context, rdb redis.UniversalClient, ks *keyspace.Space, k taskkey.Key, limit int) ([]Event, error) {
	// The list and the record's coalescing fields are read in one
	// transaction: a run starting in between folds the counts into the
	// list and deletes the fields, and a read on either side of it would
	// miss them.
	pipe := rdb.TxPipeline()
	lr := pipe.LRange(ctx, ks.History(k), int64(-limit), -1)
	rec := pipe.HGetAll(ctx, ks.Task(k))
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
	fields := rec.Val()
	for _, f := range splitList(fields["co"]) {
		_, ev, ok1 := strings.Cut(fields[f], " ")
		count, last, ok2 := strings.Cut(fields["n"+strings.TrimPrefix(f, "c")], " ")
		if ok1 && ok2 {
			repeats[ev] = [2]string{count, last}
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
