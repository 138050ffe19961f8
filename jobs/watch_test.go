package jobs

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/tasklease/tasklease/internal/redistest"
)

// Views are encoded and published only while a subscriber keeps the watch
// keys alive; without one, no script runs PUBLISH on the events channels.
func TestViewsPublishedOnlyWhileWatched(t *testing.T) {
	srv := redistest.StartServer(t)
	rdb := srv.Client(t)
	ctx := context.Background()
	e := newEnv(t, rdb, Config{Prefix: "watch", Jobs: []Job{{Scope: "course_sync",
		Stages: []Stage{{Name: "pulling", Handler: &counter{}}}}}})
	publishes := func() string {
		info, err := rdb.Info(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(info, "\n") {
			if strings.HasPrefix(l, "cmdstat_publish:") {
				return strings.TrimSpace(l)
			}
		}
		return ""
	}

	if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := e.reg.Submit(ctx, "u1", "course_sync", SubmitOptions{}); err != nil {
		t.Fatal(err)
	}
	if p := publishes(); p != "" {
		t.Fatalf("published without a subscriber: %s", p)
	}

	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	views, err := e.reg.Subscribe(sctx)
	if err != nil {
		t.Fatal(err)
	}
	if ttl := rdb.TTL(ctx, e.reg.ks.Watch(0)).Val(); ttl <= 0 || ttl > WatchTTL {
		t.Fatalf("watch key TTL %s, want (0, %s]", ttl, WatchTTL)
	}
	if _, err := e.reg.Submit(ctx, "u2", "course_sync", SubmitOptions{}); err != nil {
		t.Fatal(err)
	}
	select {
	case v := <-views:
		if v.Key != "u2|course_sync" || v.Status != StatusQueued {
			t.Fatalf("view %+v", v)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no view published while subscribed")
	}
}
