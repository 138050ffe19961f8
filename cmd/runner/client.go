package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/tasklease/tasklease/jobs"
)

// serverDefault is where client commands find a runner.
const serverDefault = "http://127.0.0.1:8080"

// client talks to a runner's HTTP API.
type client struct {
	base  string
	token string
	http  *http.Client
}

// apiError is the API's error body.
type apiError struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// do sends a request and decodes a 2xx JSON answer into out. Transport
// failures and 503 map to exit 3; other API errors to exit 2.
func (c *client) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return fail(exitUsage, "bad request: %w", err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fail(exitUnreachable, "server unreachable: %w", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fail(exitUnreachable, "reading answer: %w", err)
	}
	if resp.StatusCode/100 != 2 {
		var ae apiError
		msg := strings.TrimSpace(string(data))
		if json.Unmarshal(data, &ae) == nil && ae.Error.Message != "" {
			msg = ae.Error.Code + ": " + ae.Error.Message
		}
		code := exitUsage
		if resp.StatusCode == http.StatusServiceUnavailable {
			code = exitUnreachable
		}
		return fail(code, "%s %s: %d %s", method, path, resp.StatusCode, msg)
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fail(exitUnreachable, "decoding answer: %w", err)
		}
	}
	return nil
}

func taskPath(subject, scope string) string {
	return "/v1/tasks/" + url.PathEscape(subject) + "/" + url.PathEscape(scope)
}

func cmdClient(ctx context.Context, cmd string, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	server := fs.String("server", cmp.Or(os.Getenv("TASKLEASE_SERVER"), serverDefault), "runner HTTP API base URL (its default: $TASKLEASE_SERVER when set)")
	asJSON := fs.Bool("json", false, "print the API's JSON")
	var source, policy, delay, group, status, scope, subject, prefix *string
	var wait *bool
	var limit *int
	switch cmd {
	case "submit":
		source = fs.String("source", "manual", "schedule, foreground, manual or retry")
		policy = fs.String("policy", "", "join, skip, queue or replace (default: the job's)")
		delay = fs.String("delay", "", "with no active run, start the run no sooner than this (a duration such as 90s)")
		group = fs.String("group", "", "the fair-share group of the run this request starts (jobs with fairness groupBy request)")
		wait = fs.Bool("wait", false, "follow the run that serves the request (for queue and replace, the follow-up) until it ends; exit 1 if it fails or is cancelled")
	case "tasks":
		status = fs.String("status", "", "filter by status")
		scope = fs.String("scope", "", "filter by scope")
		subject = fs.String("subject", "", "filter by subject")
		prefix = fs.String("prefix", "", "filter by subject prefix")
		limit = fs.Int("limit", 0, "at most this many tasks")
	case "history":
		limit = fs.Int("limit", 0, "at most this many events")
	}
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	switch want := argsWanted(cmd); {
	case len(pos) == want:
	case want == 0:
		return fail(exitUsage, "%s takes no arguments, got %q", cmd, pos)
	case want == 1:
		return fail(exitUsage, "%s wants one argument (SCOPE), got %d", cmd, len(pos))
	default:
		return fail(exitUsage, "%s wants %d arguments (SUBJECT SCOPE), got %d", cmd, want, len(pos))
	}
	if u, err := url.Parse(*server); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fail(exitUsage, "--server %q: want an http:// or https:// URL such as %s", *server, serverDefault)
	}
	c := &client{base: strings.TrimRight(*server, "/"), token: os.Getenv("TASKLEASE_TOKEN"),
		http: &http.Client{Timeout: 30 * time.Second}}
	print := func(v any, text func()) {
		if *asJSON {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			_ = enc.Encode(v)
			return
		}
		text()
	}

	switch cmd {
	case "submit":
		var res jobs.SubmitResult
		body := map[string]string{"source": *source}
		if *policy != "" {
			body["policy"] = *policy
		}
		if *delay != "" {
			body["delay"] = *delay
		}
		if *group != "" {
			body["group"] = *group
		}
		if err := c.do(ctx, http.MethodPost, taskPath(pos[0], pos[1])+"/runs", body, &res); err != nil {
			return err
		}
		print(res, func() { fmt.Fprintf(stdout, "%s: %s\n", res.Outcome, describe(res.Task)) })
		if !*wait {
			return nil
		}
		last := ""
		show := func(v jobs.TaskView) { // one line (or JSON value) per visible change
			line := describe(v)
			if line == last {
				return
			}
			last = line
			print(v, func() { fmt.Fprintln(stdout, line) })
		}
		return c.wait(ctx, pos[0], pos[1], res, show)
	case "status":
		var v jobs.TaskView
		if err := c.do(ctx, http.MethodGet, taskPath(pos[0], pos[1]), nil, &v); err != nil {
			return err
		}
		print(v, func() { fmt.Fprintln(stdout, describe(v)) })
	case "tasks":
		q := url.Values{}
		for k, v := range map[string]string{"status": *status, "scope": *scope, "subject": *subject, "subjectPrefix": *prefix} {
			if v != "" {
				q.Set(k, v)
			}
		}
		if *limit > 0 {
			q.Set("limit", strconv.Itoa(*limit))
		}
		var out struct {
			Tasks []jobs.TaskView `json:"tasks"`
		}
		if err := c.do(ctx, http.MethodGet, "/v1/tasks?"+q.Encode(), nil, &out); err != nil {
			return err
		}
		print(out, func() {
			for _, v := range out.Tasks {
				fmt.Fprintln(stdout, describe(v))
			}
		})
	case "history":
		path := taskPath(pos[0], pos[1]) + "/history"
		if *limit > 0 {
			path += "?limit=" + strconv.Itoa(*limit)
		}
		var out struct {
			Events []jobs.Event `json:"events"`
		}
		if err := c.do(ctx, http.MethodGet, path, nil, &out); err != nil {
			return err
		}
		print(out, func() {
			for _, e := range out.Events {
				fmt.Fprintf(stdout, "%s  %-15s run %-8.8s %s\n", e.At.Local().Format("15:04:05.000"), e.Event, e.RunID, eventDetail(e))
			}
		})
	case "cancel":
		var out struct {
			Outcome string `json:"outcome"`
		}
		if err := c.do(ctx, http.MethodPost, taskPath(pos[0], pos[1])+"/cancel", nil, &out); err != nil {
			return err
		}
		print(out, func() { fmt.Fprintln(stdout, out.Outcome) })
	default:
		return c.console(ctx, cmd, pos, print, stdout)
	}
	return nil
}

func eventDetail(e jobs.Event) string {
	var parts []string
	add := func(k, v string) {
		if v != "" {
			parts = append(parts, k+"="+v)
		}
	}
	add("source", e.Source)
	add("stage", e.Stage)
	add("outcome", e.Outcome)
	add("error", e.Error)
	add("owner", e.Owner)
	if e.FencingToken > 0 {
		add("token", strconv.FormatInt(e.FencingToken, 10))
	}
	// a coalesced event stands for Count requests (the API's count, lastAt)
	if e.Count > 1 {
		parts = append(parts, "×"+strconv.Itoa(e.Count))
		if e.LastAt != nil {
			parts = append(parts, "(last "+e.LastAt.Local().Format("15:04:05.000")+")")
		}
	}
	return strings.Join(parts, " ")
}

// describe renders a view the way the seed asks: "running, started 14:03,
// stage pushing".
func describe(v jobs.TaskView) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", v.Key, v.Status)
	if v.Stage != "" {
		fmt.Fprintf(&b, ", stage %s", v.Stage)
	}
	if len(v.Stages) > 0 {
		fmt.Fprintf(&b, " (%d/%d stages done)", len(v.CompletedStages), len(v.Stages))
	}
	if v.StartedAt != nil {
		fmt.Fprintf(&b, ", started %s", v.StartedAt.Local().Format("15:04:05"))
	}
	if v.FinishedAt != nil {
		fmt.Fprintf(&b, ", finished %s", v.FinishedAt.Local().Format("15:04:05"))
	}
	if v.NextAttemptAt != nil {
		fmt.Fprintf(&b, ", next attempt %s", v.NextAttemptAt.Local().Format("15:04:05"))
	}
	if v.NotBefore != nil {
		fmt.Fprintf(&b, ", not before %s", v.NotBefore.Local().Format("15:04:05"))
	}
	if v.Attempt > 0 {
		fmt.Fprintf(&b, ", attempt %d/%d", v.Attempt, v.MaxAttempts)
	}
	if len(v.Sources) > 0 {
		srcs := make([]string, len(v.Sources))
		for i, s := range v.Sources {
			srcs[i] = string(s)
		}
		fmt.Fprintf(&b, ", sources %s", strings.Join(srcs, ","))
	}
	if v.Owner != "" {
		fmt.Fprintf(&b, ", owner %s token %d", v.Owner, v.FencingToken)
	}
	if v.FollowUpQueued {
		b.WriteString(", follow-up queued")
	}
	if v.Waiting != "" {
		fmt.Fprintf(&b, ", %s", v.Waiting)
	}
	if v.LastError != "" {
		fmt.Fprintf(&b, ", last error: %s", v.LastError)
	}
	return b.String()
}

// wait follows the run that serves the request until it ends, printing
// each change; exit 1 unless it ends done. That run is res.RunID: the run
// the request started or joined, or the follow-up it queued (or that
// replaces the active run) — not whatever run holds the key next, which
// may be a later request's.
func (c *client) wait(ctx context.Context, subject, scope string, res jobs.SubmitResult, show func(jobs.TaskView)) error {
	switch res.Outcome {
	case jobs.OutcomeSkipped, jobs.OutcomeThrottled:
		return nil
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // ends the event stream and its goroutine
	// a server without runId: the run its answer shows
	target := cmp.Or(res.RunID, res.Task.RunID)
	// a follow-up's requester waits behind this run
	behind := res.Task.RunID
	finished := func(v jobs.TaskView) (bool, error) {
		switch {
		case v.RunID == target:
			if v.Status.Active() || v.Status == jobs.StatusIdle {
				return false, nil
			}
			if v.Status == jobs.StatusDone {
				return true, nil
			}
			return true, &exitError{code: exitRunFailed, err: fmt.Errorf("run %s ended %s: %s", v.RunID, v.Status, v.LastError)}
		case v.RunID == behind:
			// The script that ends this run starts ours, so the record
			// shows it ended only when a cancel dropped ours (the history
			// says so).
			if v.Status.Active() || v.FollowUpQueued {
				return false, nil
			}
			return true, c.ended(ctx, subject, scope, target)
		default:
			// A newer run took ours' place in the record (the view of its
			// end came before the stream, or the script that ended it
			// started the next run at once): ours has ended, and the
			// history says how.
			return true, c.ended(ctx, subject, scope, target)
		}
	}

	key := subject + "|" + scope
	events, errc := c.events(ctx)
	var v jobs.TaskView // the stream is connected (or failed); catch up on what happened before
	if err := c.do(ctx, http.MethodGet, taskPath(subject, scope), nil, &v); err != nil {
		return err
	}
	show(v)
	if ok, err := finished(v); ok {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return fail(exitRunFailed, "interrupted while waiting")
		case err := <-errc:
			return err
		case v := <-events:
			if v.Key != key {
				continue
			}
			show(v)
			if ok, err := finished(v); ok {
				return err
			}
		}
	}
}

// ended reports how run runID of a task ended, from the task's history: nil
// when it ended done, exit 1 otherwise.
func (c *client) ended(ctx context.Context, subject, scope, runID string) error {
	var out struct {
		Events []jobs.Event `json:"events"`
	}
	if err := c.do(ctx, http.MethodGet, taskPath(subject, scope)+"/history", nil, &out); err != nil {
		return err
	}
	for _, e := range out.Events { // newest first
		if e.RunID != runID {
			continue
		}
		switch jobs.Status(e.Event) {
		case jobs.StatusDone:
			return nil
		case jobs.StatusFailed, jobs.StatusCancelled:
			return &exitError{code: exitRunFailed, err: fmt.Errorf("run %s ended %s: %s", runID, e.Event, e.Error)}
		}
	}
	return &exitError{code: exitRunFailed, err: fmt.Errorf("run %s ended; its result is no longer in the task's history", runID)}
}

// events streams TaskViews from /v1/events. It returns once the stream is
// connected (or failed, reported on the error channel).
func (c *client) events(ctx context.Context) (<-chan jobs.TaskView, <-chan error) {
	out := make(chan jobs.TaskView, 64)
	errc := make(chan error, 1)
	connected := make(chan struct{})
	go func() {
		defer close(connected)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+"/v1/events", nil)
		if err != nil {
			errc <- fail(exitUsage, "%w", err)
			return
		}
		req.Header.Set("Accept", "text/event-stream")
		if c.token != "" {
			req.Header.Set("Authorization", "Bearer "+c.token)
		}
		resp, err := (&http.Client{}).Do(req) // no timeout: the stream is long-lived
		if err != nil {
			errc <- fail(exitUnreachable, "event stream: %w", err)
			return
		}
		if resp.StatusCode != http.StatusOK {
			data, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
			resp.Body.Close()
			msg := resp.Status
			var ae apiError
			if json.Unmarshal(data, &ae) == nil && ae.Error.Message != "" {
				msg += ": " + ae.Error.Code + ": " + ae.Error.Message // e.g. too_many_clients
			}
			code := exitUsage
			if resp.StatusCode == http.StatusServiceUnavailable {
				code = exitUnreachable
			}
			errc <- fail(code, "event stream: %s", msg)
			return
		}
		connected <- struct{}{}
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			data, ok := strings.CutPrefix(sc.Text(), "data:")
			if !ok {
				continue
			}
			var v jobs.TaskView
			if json.Unmarshal([]byte(strings.TrimSpace(data)), &v) == nil {
				select {
				case out <- v:
				case <-ctx.Done():
					return
				}
			}
		}
		if ctx.Err() == nil {
			err := sc.Err()
			if err == nil {
				err = errors.New("closed by the server")
			}
			errc <- fail(exitUnreachable, "event stream: %w", err)
		}
	}()
	<-connected
	return out, errc
}
