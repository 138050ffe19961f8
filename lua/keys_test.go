package lua

import (
	"context"
	"slices"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/keyspace"
	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/taskkey"
)

// TestLuaDerivesKeyspaceNames pins the partition keys a script derives from
// a record's hash tag (tag_of, queue_of, and the suffixes finish.lua and
// claim_in_slot concatenate) to the names package keyspace gives them: a
// drift would make a script write keys nothing else reads.
func TestLuaDerivesKeyspaceNames(t *testing.T) {
	lib, err := readLib()
	if err != nil {
		t.Fatal(err)
	}
	body := `local tag = tag_of(KEYS[1])
local q = queue_of(tag)
return {tag, q.b, q.p, q.bell, q.taken, tag .. ':index', tag .. ':retry', tag .. ':watch', tag .. ':events',
  tag .. ':paused', tag .. ':parked', tag .. ':task:' .. ARGV[1], tag .. ':lease:' .. ARGV[1],
  tag .. ':history:' .. ARGV[1], string.sub(KEYS[1], #tag + 7), tag .. ':cancels', tag .. ':subjects-seen:course_sync',
  due_key(tag)}`
	src, err := compose(lib, "keys_test", body)
	if err != nil {
		t.Fatal(err)
	}
	script := redis.NewScript(src)
	rdb := redistest.StartMini(t).Client(t)
	for _, prefix := range []string{"", "tl", "a-b_c", "app:p2"} {
		ks, err := keyspace.New(prefix, 16)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range []string{"u42", "x:y", "a.b@c-d_e"} {
			k, err := taskkey.New(s, "course_sync")
			if err != nil {
				t.Fatal(err)
			}
			p := ks.Partition(k)
			want := append([]string{ks.Tag(p)}, ks.QueueKeys(p)...)
			want = append(want, ks.Index(p), ks.Retry(p), ks.Watch(p), ks.Events(p), ks.Paused(p), ks.Parked(p),
				ks.Task(k), ks.Lease(k), ks.History(k), k.String(), ks.Cancels(p), ks.Subjects(p, "course_sync"), ks.Due())
			got, err := script.Run(context.Background(), rdb, []string{ks.Task(k)}, k.String()).StringSlice()
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				t.Errorf("prefix %q key %s:\n got %q\nwant %q", prefix, k, got, want)
			}
		}
	}
}
