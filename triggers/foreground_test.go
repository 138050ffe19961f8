package triggers

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/tasklease/tasklease/internal/redistest"
	"github.com/tasklease/tasklease/jobs"
	"github.com/tasklease/tasklease/taskkey"
)

func TestForeground(t *testing.T) {
	ctx := context.Background()
	mr := redistest.StartMini(t)
	rdb := mr.Client(t)
	reg := newRegistry(t, rdb)

	t.Run("no scopes: every foreground job, nothing else", func(t *testing.T) {
		res, err := Foreground(ctx, reg, "u1", nil)
		if err != nil {
			t.Fatal(err)
		}
		var scopes []string
		for _, r := range res {
			scopes = append(scopes, r.Scope)
			if r.Outcome != jobs.OutcomeStarted || r.Task.Key != "u1|"+r.Scope || r.Task.Status != jobs.StatusQueued {
				t.Errorf("%s: outcome %s, task %+v", r.Scope, r.Outcome, r.Task)
			}
			evs, err := reg.History(ctx, "u1", r.Scope, 10)
			if err != nil || len(evs) != 1 || evs[0].Source != string(jobs.SourceForeground) {
				t.Errorf("%s history %+v, %v; want one foreground request", r.Scope, evs, err)
			}
		}
		if strings.Join(scopes, ",") != "course_sync,message_sync" {
			t.Errorf("scopes %v, want course_sync,message_sync", scopes)
		}
		if _, err := reg.Get(ctx, "u1", "backup"); !errors.Is(err, jobs.ErrNotFound) {
			t.Errorf("backup (not a foreground job) was submitted: %v", err)
		}
	})

	t.Run("second request joins the active run", func(t *testing.T) {
		res, err := Foreground(ctx, reg, "u1", []string{"course_sync"})
		if err != nil || len(res) != 1 || res[0].Outcome != jobs.OutcomeJoined {
			t.Fatalf("res %+v, err %v; want one joined", res, err)
		}
		b, err := json.Marshal(res[0])
		want := `"scope":"course_sync","outcome":"joined","runId":"` + res[0].Task.RunID + `","task":{`
		if err != nil || res[0].RunID == "" || !strings.Contains(string(b), want) {
			t.Errorf("json %s, %v; want the run that serves it named", b, err)
		}
	})

	t.Run("explicit scopes, also non-foreground ones, deduplicated", func(t *testing.T) {
		res, err := Foreground(ctx, reg, "u2", []string{"backup", "course_sync", "backup"})
		if err != nil || len(res) != 2 || res[0].Scope != "backup" || res[1].Scope != "course_sync" {
			t.Fatalf("res %+v, err %v", res, err)
		}
	})

	t.Run("unknown scope: error, nothing submitted", func(t *testing.T) {
		res, err := Foreground(ctx, reg, "u3", []string{"course_sync", "nope", "Bad Scope"})
		if !errors.Is(err, jobs.ErrUnknownScope) || res != nil {
			t.Fatalf("res %+v, err %v; want ErrUnknownScope", res, err)
		}
		if !strings.Contains(err.Error(), "nope") || !strings.Contains(err.Error(), "Bad Scope") {
			t.Errorf("err %v does not list every unknown scope", err)
		}
		if _, err := reg.Get(ctx, "u3", "course_sync"); !errors.Is(err, jobs.ErrNotFound) {
			t.Errorf("course_sync submitted despite the unknown scope: %v", err)
		}
	})

	t.Run("invalid subject", func(t *testing.T) {
		if _, err := Foreground(ctx, reg, "u 4", nil); !errors.Is(err, taskkey.ErrInvalid) {
			t.Fatalf("err %v, want taskkey.ErrInvalid", err)
		}
	})

	t.Run("no foreground jobs", func(t *testing.T) {
		stages := []jobs.Stage{{Name: "pulling", Handler: noop}}
		reg2, err := jobs.NewRegistry(rdb, jobs.Config{Prefix: "other", Logger: testLogger(),
			Jobs: []jobs.Job{{Scope: "backup", Stages: stages}}})
		if err != nil {
			t.Fatal(err)
		}
		res, err := Foreground(ctx, reg2, "u5", nil)
		if err != nil || res == nil || len(res) != 0 {
			t.Fatalf("res %#v, err %v; want an empty list", res, err)
		}
	})

	t.Run("nil registry", func(t *testing.T) {
		if _, err := Foreground(ctx, nil, "u1", nil); !errors.Is(err, jobs.ErrConfig) {
			t.Fatalf("err %v", err)
		}
	})
}
