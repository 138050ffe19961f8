package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tasklease/tasklease/jobs"
	"github.com/tasklease/tasklease/triggers"
)

// argsWanted is the number of positional arguments of a client command.
func argsWanted(cmd string) int {
	switch cmd {
	case "tasks", "scopes", "runners", "limiters", "schedules":
		return 0
	case "pause", "resume":
		return 1
	}
	return 2
}

// console runs the operator commands: scopes, pause, resume, runners,
// limiters and schedules. print renders JSON with --json, else calls its text func.
func (c *client) console(ctx context.Context, cmd string, pos []string, print func(any, func()), stdout io.Writer) error {
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	defer tw.Flush()
	switch cmd {
	case "scopes":
		var ov jobs.Overview
		if err := c.do(ctx, http.MethodGet, "/v1/scopes", nil, &ov); err != nil {
			return err
		}
		print(ov, func() {
			fmt.Fprintln(tw, "SCOPE\tSTATE\tQUEUED\tRUNNING\tRETRYING\tDONE\tFAILED\tCANCELLED\tLAST HOUR\tSTAGES")
			for _, s := range ov.Scopes {
				state := "active"
				if s.Paused {
					state = "PAUSED"
				}
				fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d done, %d failed\t%s\n", s.Scope, state,
					s.Counts[jobs.StatusQueued], s.Counts[jobs.StatusRunning], s.Counts[jobs.StatusRetrying],
					s.Counts[jobs.StatusDone], s.Counts[jobs.StatusFailed], s.Counts[jobs.StatusCancelled],
					s.LastHour.Done, s.LastHour.Failed, strings.Join(s.Stages, " → "))
			}
			fmt.Fprintf(tw, "queue: %d queued or taken, %d waiting to retry\n", ov.Queue.Stream, ov.Queue.Retry)
		})
	case "pause", "resume":
		var out struct {
			Scope    string `json:"scope"`
			Paused   bool   `json:"paused"`
			Requeued *int   `json:"requeued,omitempty"`
		}
		if err := c.do(ctx, http.MethodPost, "/v1/scopes/"+url.PathEscape(pos[0])+"/"+cmd, nil, &out); err != nil {
			return err
		}
		print(out, func() {
			if out.Paused {
				fmt.Fprintf(tw, "%s paused: requests queue, no runner claims them until resume\n", out.Scope)
				return
			}
			fmt.Fprintf(tw, "%s resumed; %d waiting runs re-queued\n", out.Scope, deref(out.Requeued))
		})
	case "runners":
		var out struct {
			Runners []jobs.RunnerInfo `json:"runners"`
		}
		if err := c.do(ctx, http.MethodGet, "/v1/runners", nil, &out); err != nil {
			return err
		}
		print(out, func() {
			fmt.Fprintln(tw, "OWNER\tSTATE\tACTIVE\tHEARTBEAT\tSTARTED\tVERSION")
			for _, r := range out.Runners {
				state := "alive"
				if !r.Alive {
					state = "gone"
				}
				fmt.Fprintf(tw, "%s\t%s\t%d/%d\t%s ago\t%s\t%s\n", r.Owner, state, r.Active, r.Concurrency,
					(time.Duration(r.HeartbeatAgeSeconds * float64(time.Second))).Round(100*time.Millisecond),
					r.StartedAt.Local().Format("2006-01-02 15:04:05"), r.Version)
			}
		})
	case "limiters":
		var out struct {
			Limiters []jobs.LimiterView `json:"limiters"`
		}
		if err := c.do(ctx, http.MethodGet, "/v1/limiters", nil, &out); err != nil {
			return err
		}
		print(out, func() {
			if len(out.Limiters) == 0 {
				fmt.Fprintln(tw, "no limiters configured")
				return
			}
			fmt.Fprintln(tw, "NAME\tCONCURRENCY\tIN-USE\tRATE\tBURST\tWAITING\tHELD-UNTIL\tJOBS")
			for _, l := range out.Limiters {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%d\t%s\t%s\n", l.Name, orDash(l.Concurrency), l.InUse,
					cmp.Or(l.Rate, "-"), orDash(l.Burst), l.Waiting, heldUntil(l.HeldUntil), cmp.Or(strings.Join(l.Jobs, ","), "-"))
			}
		})
	case "schedules":
		var out struct {
			Schedules []triggers.ScheduleStatus `json:"schedules"`
		}
		if err := c.do(ctx, http.MethodGet, "/v1/schedules", nil, &out); err != nil {
			return err
		}
		print(out, func() {
			fmt.Fprintln(tw, "NAME\tCRON\tSCOPE\tSUBJECTS\tNEXT\tLAST FIRED\tFAN-OUT\tEARLIER\tLEADER")
			for _, s := range out.Schedules {
				subjects := "all"
				if !s.Subjects.All {
					subjects = fmt.Sprint(s.Subjects.Count)
				}
				next, last, fan := "-", "-", "-"
				if s.NextOccurrence != nil {
					next = s.NextOccurrence.Local().Format("15:04:05")
				}
				if o := s.LastOccurrence; o != nil {
					last = o.Occurrence.Local().Format("15:04:05")
					fan = fanOutProgress(o)
				}
				leader := s.Leader
				if leader == "" {
					leader = "(none)"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s.Name, s.Cron, s.Scope, subjects, next, last, fan,
					earlierFanOuts(s.RecentOccurrences), leader)
			}
		})
	}
	return nil
}

// fanOutProgress renders an occurrence's fan-out: "done, 1000 submitted"
// or "partition 3/16, 420 submitted".
func fanOutProgress(o *triggers.FanOutStatus) string {
	switch {
	case o.Abandoned:
		return fmt.Sprintf("abandoned, %d submitted", o.Submitted)
	case o.Done:
		return fmt.Sprintf("done, %d submitted", o.Submitted)
	case o.Partitions > 0:
		return fmt.Sprintf("partition %d/%d, %d submitted", o.Partition, o.Partitions, o.Submitted)
	}
	return fmt.Sprintf("%d/%d, %d submitted", o.Index, o.Total, o.Submitted)
}

// earlierFanOuts summarises the fan-outs before the last one: "-", or
// "12 done" / "11 done, 1 abandoned" with the longest one's duration.
func earlierFanOuts(rs []*triggers.FanOutStatus) string {
	if len(rs) == 0 {
		return "-"
	}
	done, abandoned := 0, 0
	var longest time.Duration
	for _, o := range rs {
		if o.Abandoned {
			abandoned++
			continue
		}
		done++
		if o.FinishedAt != nil {
			longest = max(longest, o.FinishedAt.Sub(o.StartedAt))
		}
	}
	out := fmt.Sprintf("%d done", done)
	if abandoned > 0 {
		out += fmt.Sprintf(", %d abandoned", abandoned)
	}
	if done > 0 {
		out += fmt.Sprintf(" (longest %s)", longest.Round(time.Millisecond))
	}
	return out
}

// orDash renders a limit: "-" for 0 (none).
func orDash(n int) string {
	if n == 0 {
		return "-"
	}
	return strconv.Itoa(n)
}

// heldUntil renders a limiter's hold: its end in local time, or "-".
func heldUntil(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.Local().Format("15:04:05")
}

func deref(n *int) int {
	if n == nil {
		return 0
	}
	return *n
}
