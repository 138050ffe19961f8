package main

import (
	"fmt"
	"testing"
	"time"

	"github.com/tasklease/tasklease/jobs"
	"github.com/tasklease/tasklease/triggers"
)

// TestServeOneOwnerID: serve's runner and its cron scheduler are one
// process, so GET /v1/schedules must name as leader the owner GET
// /v1/runners lists (it named the runner id with a suffix of its own).
func TestServeOneOwnerID(t *testing.T) {
	t.Setenv("TASKLEASE_TOKEN", "")
	srv := startServe(t, consoleConfig)

	var leader string
	eventually(t, 10*time.Second, "a cron leader", func() error {
		var body struct {
			Schedules []triggers.ScheduleStatus `json:"schedules"`
		}
		if _, err := getJSON(srv.url+"/v1/schedules", "", &body); err != nil {
			return err
		}
		if len(body.Schedules) != 1 || body.Schedules[0].Leader == "" {
			return fmt.Errorf("schedules: %+v", body.Schedules)
		}
		leader = body.Schedules[0].Leader
		return nil
	})
	var owners []string
	eventually(t, 10*time.Second, "the runner listed", func() error {
		var body struct {
			Runners []jobs.RunnerInfo `json:"runners"`
		}
		if _, err := getJSON(srv.url+"/v1/runners", "", &body); err != nil {
			return err
		}
		owners = owners[:0]
		for _, r := range body.Runners {
			owners = append(owners, r.Owner)
		}
		if len(owners) != 1 {
			return fmt.Errorf("runners: %v", owners)
		}
		return nil
	})
	if leader != owners[0] {
		t.Fatalf("one process, two owner ids: cron leader %q, runner %q", leader, owners[0])
	}
}
