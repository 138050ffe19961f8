package jobs

import (
	"context"
	"os"
	"reflect"
	"regexp"
	"testing"
	"time"

	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/taskkey"
)

// A request that changes nothing answers with the record's cached view
// (lib/submitting.lua submit_fast). Through a run's whole life the view it answers
// with must be the one Get reads from the record: the cache is cleared by
// every write of a view field and ignored when its stamp no longer matches.
func TestJoinViewFollowsEveryChange(t *testing.T) {
	t.Parallel()
	const subject, scope = "u1", "course_sync"
	ctx := context.Background()
	for _, b := range redistest.Backends(t) {
		t.Run(b.Name, func(t *testing.T) {
			pull, push := newClHold(1), newClHold(1)
			e := newEnv(t, b.Client, Config{Prefix: "vc", Jobs: []Job{clJob(scope,
				Stage{Name: "pulling", Handler: pull}, Stage{Name: "pushing", Handler: push})}})
			k := taskkey.MustNew(subject, scope)
			// joins sends three joins (the first of a source in a run takes
			// the slow path, the second fills the cache, the third reads it)
			// and compares each answer with Get.
			joins := func(what string, wantStatus Status, wantStage string) {
				t.Helper()
				for i := range 3 {
					r := clSubmit(t, e.reg, subject, scope, SourceManual, PolicyJoin)
					got, err := e.reg.Get(ctx, subject, scope)
					if err != nil {
						t.Fatal(err)
					}
					if r.Outcome != OutcomeJoined || !reflect.DeepEqual(r.Task, got) {
						t.Fatalf("%s, join %d: outcome %s, view\n %+v\nGet\n %+v", what, i+1, r.Outcome, r.Task, got)
					}
					if got.Status != wantStatus || got.Stage != wantStage {
						t.Fatalf("%s: status %s stage %q, want %s %q", what, got.Status, got.Stage, wantStatus, wantStage)
					}
				}
			}

			first := clSubmit(t, e.reg, subject, scope, SourceManual, PolicyJoin)
			if got, _ := e.reg.Get(ctx, subject, scope); first.Outcome != OutcomeStarted || !reflect.DeepEqual(first.Task, got) {
				t.Fatalf("start: outcome %s, view\n %+v\nGet\n %+v", first.Outcome, first.Task, got)
			}
			joins("queued", StatusQueued, "")
			if v := clRaw(t, e.reg, subject, scope)["v"]; v == "" {
				t.Fatal("repeated joins left no cached view: the test no longer covers the cache")
			}

			_, stop := e.startRunner(RunnerConfig{ID: "pod-a", Concurrency: 1})
			run := clRecv(t, pull.entered, 5*time.Second, "pulling to start")
			joins("claimed", StatusRunning, "pulling")
			if err := run.SaveProgress(ctx, []byte("page 2")); err != nil {
				t.Fatal(err)
			}
			joins("after progress", StatusRunning, "pulling")
			pull.open()
			clRecv(t, push.entered, 5*time.Second, "pushing to start")
			joins("advanced", StatusRunning, "pushing")

			// A writer that does not know the cache (an older version in a
			// rolling deploy) changes a stamped field without clearing it.
			if err := e.rdb.HSet(ctx, e.reg.ks.Task(k), "updatedAt", "1700000000000").Err(); err != nil {
				t.Fatal(err)
			}
			joins("after a write that left the cache", StatusRunning, "pushing")

			if _, err := e.reg.Cancel(ctx, subject, scope); err != nil {
				t.Fatal(err)
			}
			e.waitStatus(subject, scope, 5*time.Second, StatusCancelled)
			stop() // the next run stays queued while its view is compared
			next := clSubmit(t, e.reg, subject, scope, SourceForeground, PolicyJoin)
			got, _ := e.reg.Get(ctx, subject, scope)
			if next.Outcome != OutcomeStarted || next.Task.RunID == first.Task.RunID || !reflect.DeepEqual(next.Task, got) {
				t.Fatalf("after the run ended: outcome %s, view\n %+v\nGet\n %+v", next.Outcome, next.Task, got)
			}
		})
	}
}

// The cached view is VIEW_FIELDS' values in order; a cache written by a
// version with other fields must not be read as this version's. V_TAG in
// lua/lib/submitting.lua names the layout: change it together with these fields.
func TestViewCacheTag(t *testing.T) {
	pinned := [vfCount]string{"runId", "status", "stage", "stages", "done", "attempt", "maxAttempts", "sources",
		"owner", "token", "requestedAt", "startedAt", "updatedAt", "finishedAt", "nextAttemptAt", "lastError",
		"cancel", "followUp", "waiting"}
	src, err := os.ReadFile("../lua/lib/submitting.lua")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`local V_TAG = '([^']*)'`).FindSubmatch(src)
	if m == nil || string(m[1]) != "v2" || viewFieldNames != pinned {
		t.Fatalf("the view fields or V_TAG changed (tag %q): bump V_TAG in lua/lib/submitting.lua and pin the new fields and tag here", m)
	}
}
