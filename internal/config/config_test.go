package config

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"go.yaml.in/yaml/v3"

	"github.com/tasklease/tasklease/jobs"
)

const examplePath = "../../config.example.yaml"

// clearEnv unsets the variables the example references, so the test sees
// the fresh-machine defaults whatever the developer's shell exports.
func clearEnv(t *testing.T) {
	t.Helper()
	for _, k := range []string{"TASKLEASE_REDIS_URL", "TASKLEASE_REDIS_PASSWORD", "TASKLEASE_RUNNER_ID", "TASKLEASE_TOKEN", "TASKLEASE_LOG_LEVEL", "PUSH_API_TOKEN"} {
		t.Setenv(k, "")
	}
}

// mustParse parses yaml text or fails the test with every problem.
func mustParse(t *testing.T, text string) *Config {
	t.Helper()
	c, err := Parse([]byte(text))
	if err != nil {
		t.Fatalf("Parse:\n%v\n--- config:\n%s", err, text)
	}
	return c
}

// problemsOf parses text, expects it to fail, and returns the problems.
func problemsOf(t *testing.T, text string) Problems {
	t.Helper()
	_, err := Parse([]byte(text))
	if err == nil {
		t.Fatalf("Parse succeeded, want problems; config:\n%s", text)
	}
	if !errors.Is(err, ErrInvalid) {
		t.Fatalf("errors.Is(err, ErrInvalid) = false for %v", err)
	}
	var ps Problems
	if !errors.As(err, &ps) {
		t.Fatalf("error %T is not Problems", err)
	}
	return ps
}

// wantProblem asserts a problem at path whose message contains substr.
func wantProblem(t *testing.T, ps Problems, path, substr string) {
	t.Helper()
	for _, p := range ps {
		if p.Path == path && strings.Contains(p.Message, substr) {
			return
		}
	}
	t.Errorf("no problem at %q containing %q; got:\n%v", path, substr, ps)
}

// checkWithJobsPackage builds a registry and a runner from c, proving the
// config is accepted by the code that runs it, not just by this package.
func checkWithJobsPackage(t testing.TB, c *Config) []jobs.Job {
	t.Helper()
	js, err := c.BuildJobs()
	if err != nil {
		t.Fatalf("BuildJobs: %v", err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	defer rdb.Close()
	rc := c.RegistryConfig()
	rc.Jobs = js
	reg, err := jobs.NewRegistry(rdb, rc)
	if err != nil {
		t.Fatalf("NewRegistry: %v", err)
	}
	if _, err := jobs.NewRunner(reg, c.RunnerConfig()); err != nil {
		t.Fatalf("NewRunner: %v", err)
	}
	return js
}

func TestExampleConfig(t *testing.T) {
	clearEnv(t)
	t.Setenv("TASKLEASE_TOKEN", "s3cret")
	c, err := Load(examplePath)
	if err != nil {
		t.Fatalf("Load(%s):\n%v", examplePath, err)
	}
	if !c.Embedded() {
		t.Error("Embedded() = false; the example must run on a fresh machine")
	}
	if c.HTTP.Token != "s3cret" {
		t.Errorf("token = %q, want the expanded ${TASKLEASE_TOKEN}", c.HTTP.Token)
	}
	if c.Log.Level != "info" {
		t.Errorf("log.level = %q, want the ${...:-info} default", c.Log.Level)
	}
	host, _ := os.Hostname()
	if host != "" && c.Runner.ID == "" {
		t.Error("runner.id empty, want the hostname")
	}
	if c.Partitions != 16 || c.Runner.Concurrency != 16 || c.Runner.LeaseTTL.D() != 15*time.Second ||
		c.HTTP.Listen != "127.0.0.1:8080" || c.HTTP.BodyLimit != 1<<20 || c.Retention.D() != 168*time.Hour || c.HistoryCap != 200 {
		t.Errorf("unexpected settings: %+v", c)
	}
	if c.HTTP.MaxEventClients != 100 || len(c.HTTP.AllowedOrigins) != 0 {
		t.Errorf("http browser settings: %+v", c.HTTP)
	}
	if len(c.Schedules) != 2 || !c.Schedules[0].Subjects.All || !slices.Equal(c.Schedules[1].Subjects.List, []string{"u42", "u43"}) {
		t.Errorf("schedules = %+v", c.Schedules)
	}
	if c.Schedules[0].Cron != "*/15 * * * *" || c.Schedules[1].Cron != "@every 30s" {
		t.Errorf("schedule crons = %q, %q", c.Schedules[0].Cron, c.Schedules[1].Cron)
	}

	js := checkWithJobsPackage(t, c)
	var scopes []string
	for _, j := range js {
		scopes = append(scopes, j.Scope)
	}
	if !slices.Equal(scopes, []string{"backup", "course_sync", "message_sync"}) {
		t.Fatalf("scopes = %v", scopes)
	}
	cs := js[1]
	if !cs.Foreground || cs.OnConflict != jobs.PolicyJoin || cs.MinInterval != 30*time.Second ||
		cs.Retry != (jobs.RetryPolicy{MaxAttempts: 5, Backoff: time.Second, MaxBackoff: 5 * time.Minute}) {
		t.Errorf("course_sync = %+v", cs)
	}
	if got := cs.StageNames(); !slices.Equal(got, []string{"pulling", "pushing"}) {
		t.Errorf("course_sync stages = %v", got)
	}
	ex, ok := cs.Stages[0].Handler.(*jobs.ExecStage)
	if !ok {
		t.Fatalf("course_sync pulling handler = %T", cs.Stages[0].Handler)
	}
	if want := []string{"sh", "-c", "echo pulling for $TASKLEASE_SUBJECT; sleep 1"}; !slices.Equal(ex.Command, want) {
		t.Errorf("command = %q, want %q (a bare $ stays literal)", ex.Command, want)
	}
	if !slices.Equal(ex.Env, []string{"SYNC_MODE=pull"}) || ex.KillGrace != 5*time.Second || cs.Stages[0].Timeout != 5*time.Minute {
		t.Errorf("exec stage = %+v, timeout %v", ex, cs.Stages[0].Timeout)
	}
	if b := js[0]; b.OnConflict != jobs.PolicyQueue || b.LeaseTTL != 30*time.Second || b.Foreground {
		t.Errorf("backup = %+v", b)
	}
}

// TestExampleHTTPStage uncomments the example's http stage, so the
// documented snippet is known to be valid too.
func TestExampleHTTPStage(t *testing.T) {
	clearEnv(t)
	t.Setenv("PUSH_API_TOKEN", "push-token")
	data, err := os.ReadFile(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	found := false
	for _, l := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(l, "      # "); ok && (strings.HasPrefix(rest, "- name: pushing") || found && strings.HasPrefix(rest, "  ")) {
			if strings.HasPrefix(rest, "- name: pushing") {
				rest = "- name: notify"
				found = true
			}
			out = append(out, "      "+rest)
			continue
		}
		if found && !strings.HasPrefix(l, "      ") {
			found = false
		}
		out = append(out, l)
	}
	c := mustParse(t, strings.Join(out, "\n"))
	stages := c.Jobs["course_sync"].Stages
	if len(stages) != 3 || stages[2].HTTP == nil {
		t.Fatalf("http example not found or not parsed: %+v", stages)
	}
	js := checkWithJobsPackage(t, c)
	h, ok := js[1].Stages[2].Handler.(*jobs.HTTPStage)
	if !ok {
		t.Fatalf("handler = %T", js[1].Stages[2].Handler)
	}
	if h.URL != "http://127.0.0.1:9000/push" || h.Header["Authorization"] != "Bearer push-token" ||
		h.Client == nil || h.Client.Timeout != 30*time.Second || js[1].Stages[2].Timeout != time.Minute {
		t.Errorf("http stage = %+v (client %+v), timeout %v", h, h.Client, js[1].Stages[2].Timeout)
	}
}

func TestEnvExpansion(t *testing.T) {
	env := map[string]string{"SET": "value", "EMPTY": "", "WITH_NL": "a\nb"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	for in, want := range map[string]string{
		"a: ${SET}":          "a: value",
		"a: ${UNSET}":        "a: ",
		"a: ${UNSET:-def}":   "a: def",
		"a: ${EMPTY:-def}":   "a: def",
		"a: ${EMPTY}":        "a: ",
		"a: ${SET:-def}":     "a: value",
		"a: ${UNSET:-}":      "a: ",
		"a: ${UNSET:-x y:z}": "a: x y:z",
		"a: ${SET}${SET}":    "a: valuevalue",
		"a: ${WITH_NL}":      "a: a\nb",
		"${SET}":             "value",
		"a: ${_x1}":          "a: ",
		// A bare $ and every other form stay literal, for the shell.
		"a: $SET $ $$ $1 $}":    "a: $SET $ $$ $1 $}",
		"a: ${SET:?required}":   "a: ${SET:?required}",
		"a: ${file%.txt}":       "a: ${file%.txt}",
		"a: ${1X} ${} ${SET-x}": "a: ${1X} ${} ${SET-x}",
		"# unterminated ${ ok":  "# unterminated ${ ok",
		"a: ${SET\nb: }":        "a: ${SET\nb: }",
		"a: ${A:-x\ny}":         "a: ${A:-x\ny}",
		"a: ${A:-${SET}}":       "a: ${A:-value}",
		// $${ escapes.
		"a: $${SET} $${": "a: ${SET} ${",
		"a: $$${SET}":    "a: $${SET}",
	} {
		if got := expandEnv(in, lookup); got != want {
			t.Errorf("expandEnv(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestEnvExpansionInParse(t *testing.T) {
	t.Setenv("TL_TEST_URL", "redis://10.1.2.3:6380/2")
	t.Setenv("TL_TEST_CONC", "7")
	t.Setenv("TL_TEST_EMPTY", "")
	c := mustParse(t, `
redis:
  url: ${TL_TEST_URL}
runner:
  concurrency: ${TL_TEST_CONC}
  leaseTTL: ${TL_TEST_UNSET_TTL:-20s}
http:
  token: "${TL_TEST_EMPTY:-fallback}"
`)
	if c.Redis.URL != "redis://10.1.2.3:6380/2" || c.Runner.Concurrency != 7 || c.Runner.LeaseTTL.D() != 20*time.Second || c.HTTP.Token != "fallback" {
		t.Errorf("expanded config = %+v", c)
	}
	if c.Embedded() {
		t.Error("Embedded() with a url")
	}

	// A value with YAML syntax inside quotes stays one string.
	t.Setenv("TL_TEST_TOKEN", "a: b # c")
	if c := mustParse(t, `http: {token: "${TL_TEST_TOKEN}"}`); c.HTTP.Token != "a: b # c" {
		t.Errorf("token = %q", c.HTTP.Token)
	}
}

func TestBrokenConfig(t *testing.T) {
	_, err := Load("testdata/broken.yaml")
	if err == nil {
		t.Fatal("broken.yaml loaded")
	}
	if !errors.Is(err, ErrInvalid) {
		t.Errorf("errors.Is(err, ErrInvalid) = false")
	}
	var ps Problems
	if !errors.As(err, &ps) {
		t.Fatalf("error %T is not Problems", err)
	}
	want := map[string]string{
		"redis.url":                           "invalid URL",
		"redis.prefx":                         `did you mean "prefix"`,
		"partitions":                          "not in 1..1024",
		"runner.concurrency":                  `expected an integer, got string "ten"`,
		"runner.leaseTTL":                     "below the minimum 100ms",
		"http.listen":                         "not host:port",
		"log.level":                           `"verbose"`,
		"log.format":                          `"xml"`,
		"retention":                           `invalid duration "15"`,
		"jobs.course_sync.onConflict":         `"merge" is not one of`,
		"jobs.course_sync.retry.maxAttempts":  "at least 1",
		"jobs.course_sync.retry.backoff":      "longer than maxBackoff 1m0s",
		"jobs.course_sync.stages[0].exec":     "empty command",
		"jobs.course_sync.stages[1].name":     `invalid stage name "Pushing"`,
		"jobs.course_sync.stages[1]":          "not both",
		"jobs.course_sync.stages[1].http.url": "scheme must be http or https",
		"jobs.course_sync.stages[2].name":     "duplicate stage name",
		"jobs.course_sync.stages[2].exex":     `did you mean "exec"`,
		"jobs.course_sync.stages[2]":          "set exactly one of exec or http",
		"jobs.Bad-Scope":                      "invalid scope name",
		"jobs.Bad-Scope.stages[0].timeout":    `negative duration "-1s"`,
		"schedules[0].name":                   "invalid schedule name",
		"schedules[0].cron":                   "61",
		"schedules[0].scope":                  `"nope" is not a configured job`,
		"schedules[0].subjects[1]":            `invalid subject "bad subject"`,
		"schedules[1].subjects":               `expected "all" or a list`,
	}
	for path, substr := range want {
		wantProblem(t, ps, path, substr)
	}
	// The error text is one "path: message" line per problem.
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != len(ps) {
		t.Errorf("%d lines for %d problems", len(lines), len(ps))
	}
	for i, p := range ps {
		if lines[i] != p.Path+": "+p.Message {
			t.Errorf("line %d = %q, want %q", i, lines[i], p.Path+": "+p.Message)
		}
		if p.Line == 0 {
			t.Errorf("problem %v has no line", p)
		}
	}
	// Problems come in file order.
	if !slices.IsSortedFunc(ps, func(a, b Problem) int { return a.Line - b.Line }) {
		t.Errorf("problems not in line order:\n%v", err)
	}
	if testing.Verbose() {
		t.Logf("broken.yaml:\n%v", err)
	}
}

func TestUnknownKeys(t *testing.T) {
	ps := problemsOf(t, `
partitons: 4
runner:
  leasettl: 10s
  color: blue
jobs:
  x:
    stages:
      - name: a
        exex: ["true"]
`)
	wantProblem(t, ps, "partitons", `unknown key (did you mean "partitions"?)`)
	wantProblem(t, ps, "runner.leasettl", `did you mean "leaseTTL"`)
	wantProblem(t, ps, "runner.color", "unknown key (known: id, concurrency, leaseTTL, shutdownGrace, execStarts)")
	wantProblem(t, ps, "jobs.x.stages[0].exex", `did you mean "exec"`)
	wantProblem(t, ps, "jobs.x.stages[0]", "set exactly one of exec or http")
	for _, p := range ps {
		if p.Path == "partitons" && p.Line != 2 {
			t.Errorf("partitons line = %d, want 2", p.Line)
		}
	}
}

func TestTypeErrors(t *testing.T) {
	ps := problemsOf(t, `
partitions: 1.5
runner:
  concurrency: "ten"
  id: [a, b]
http: "127.0.0.1:80"
historyCap: 99999999999999999999999
jobs:
  x:
    foreground: "yes"
    retry: [1]
    stages:
      - name: a
        exec: "./sync.sh pull"
      -
      - name: b
        exec: [sh, [nested]]
        env: [A=B]
schedules: {name: x}
`)
	wantProblem(t, ps, "partitions", "expected an integer, got number 1.5")
	wantProblem(t, ps, "runner.concurrency", `expected an integer, got string "ten"`)
	wantProblem(t, ps, "runner.id", "expected a string, got a list")
	wantProblem(t, ps, "http", `expected a mapping, got string "127.0.0.1:80"`)
	wantProblem(t, ps, "historyCap", "out of range")
	wantProblem(t, ps, "jobs.x.foreground", `expected true or false, got string "yes"`)
	wantProblem(t, ps, "jobs.x.retry", "expected a mapping, got a list")
	wantProblem(t, ps, "jobs.x.stages[0].exec", `write a list, e.g. ["./sync.sh pull"]`)
	wantProblem(t, ps, "jobs.x.stages[1]", "expected a value, got null")
	wantProblem(t, ps, "jobs.x.stages[2].exec[1]", "expected a string, got a list")
	wantProblem(t, ps, "jobs.x.stages[2].env", "expected a mapping, got a list")
	wantProblem(t, ps, "schedules", "expected a list, got a mapping")
	// A value that could not be decoded gets no follow-up problems.
	for _, p := range ps {
		if p.Path == "partitions" && !strings.Contains(p.Message, "expected") || strings.HasPrefix(p.Path, "jobs.x.stages[1].") ||
			p.Path == "jobs.x.stages[0]" {
			t.Errorf("follow-up problem %v", p)
		}
	}
	wantProblem(t, problemsOf(t, "historyCap: 9223372036854775808"), "historyCap", "out of range")
}

func TestSyntaxErrors(t *testing.T) {
	ps := problemsOf(t, "runner:\n  id: a\n bad: [\n")
	if len(ps) != 1 || ps[0].Path != "" || !strings.HasPrefix(ps[0].Message, "yaml: ") || ps[0].Line == 0 {
		t.Errorf("syntax error problems = %#v", ps)
	}
	ps = problemsOf(t, "partitions: 4\n---\npartitions: 8\n")
	wantProblem(t, ps, "", "second document")
	ps = problemsOf(t, "- a\n- b\n")
	wantProblem(t, ps, "", "expected a mapping, got a list")
	ps = problemsOf(t, "runner: {id: a, id: b}\n")
	wantProblem(t, ps, "runner.id", "duplicate key (first on line 1)")
	ps = problemsOf(t, "jobs:\n  [a]: x\n")
	wantProblem(t, ps, "jobs", "mapping keys must be strings")
}

func TestSubjects(t *testing.T) {
	base := "jobs:\n  sync:\n    stages: [{name: a, exec: [\"true\"]}]\nschedules:\n  - {name: s, cron: \"@hourly\", scope: sync, subjects: %s}\n"
	parse := func(subjects string) (*Config, error) {
		return Parse([]byte(strings.Replace(base, "%s", subjects, 1)))
	}
	c, err := parse("all")
	if err != nil || !c.Schedules[0].Subjects.All || c.Schedules[0].Subjects.List != nil {
		t.Errorf("all: %+v, %v", c, err)
	}
	c, err = parse(`[u42, "alice@example.com", 7]`)
	if err != nil || c.Schedules[0].Subjects.All || !slices.Equal(c.Schedules[0].Subjects.List, []string{"u42", "alice@example.com", "7"}) {
		t.Errorf("list: %+v, %v", c, err)
	}
	for subjects, want := range map[string][2]string{
		"everyone":     {"schedules[0].subjects", `expected "all" or a list of subjects such as [u42, u43], got string "everyone"`},
		"u42":          {"schedules[0].subjects", `got string "u42"`},
		"ALL":          {"schedules[0].subjects", `got string "ALL"`},
		"42":           {"schedules[0].subjects", "got integer 42"},
		"{all: true}":  {"schedules[0].subjects", "got a mapping"},
		"[]":           {"schedules[0].subjects", "required"},
		"~":            {"schedules[0].subjects", "required"},
		"[u1, '-x']":   {"schedules[0].subjects[1]", `invalid subject "-x"`},
		"[u1, u2, u1]": {"schedules[0].subjects[2]", "duplicate subject"},
		"[u1, [u2]]":   {"schedules[0].subjects[1]", "expected a subject, got a list"},
	} {
		_, err := parse(subjects)
		var ps Problems
		if !errors.As(err, &ps) {
			t.Errorf("subjects %s: err = %v, want problems", subjects, err)
			continue
		}
		wantProblem(t, ps, want[0], want[1])
	}

	// The type also works with plain yaml.Unmarshal.
	var s struct{ S Subjects }
	if err := yaml.Unmarshal([]byte("s: all"), &s); err != nil || !s.S.All {
		t.Errorf("yaml.Unmarshal all: %+v %v", s, err)
	}
	if err := yaml.Unmarshal([]byte("s: nobody"), &s); err == nil {
		t.Error("yaml.Unmarshal accepted s: nobody")
	}
	out, err := yaml.Marshal(struct{ A, B Subjects }{Subjects{All: true}, Subjects{List: []string{"u1"}}})
	if err != nil || string(out) != "a: all\nb:\n    - u1\n" {
		t.Errorf("Marshal = %q, %v", out, err)
	}
}

func TestDurations(t *testing.T) {
	for in, want := range map[string]time.Duration{`"15s"`: 15 * time.Second, "15s": 15 * time.Second, "1h30m": 90 * time.Minute, "500ms": 500 * time.Millisecond} {
		c := mustParse(t, "runner:\n  leaseTTL: "+in+"\n")
		if c.Runner.LeaseTTL.D() != want {
			t.Errorf("%s = %v, want %v", in, c.Runner.LeaseTTL, want)
		}
	}
	for in, want := range map[string]string{
		"15":    `expected a duration with a unit such as "15s", got the bare number 15`,
		"1.5":   "got the bare number 1.5",
		`"15"`:  `invalid duration "15": want a Go duration such as "15s"`,
		`"-1s"`: `negative duration "-1s"`,
		"7d":    `write "168h" for 7 days`,
		"[1s]":  "got a list",
		"true":  "got boolean true",
	} {
		ps := problemsOf(t, "runner:\n  shutdownGrace: "+in+"\n")
		wantProblem(t, ps, "runner.shutdownGrace", want)
	}
	var d struct{ D Duration }
	if err := yaml.Unmarshal([]byte("d: 2m"), &d); err != nil || d.D.D() != 2*time.Minute {
		t.Errorf("yaml.Unmarshal: %v %v", d, err)
	}
	if err := yaml.Unmarshal([]byte("d: 2"), &d); err == nil {
		t.Error("yaml.Unmarshal accepted a bare number")
	}
	if out, _ := yaml.Marshal(struct{ D Duration }{Duration(90 * time.Second)}); string(out) != "d: 1m30s\n" {
		t.Errorf("Marshal = %q", out)
	}
}

func TestDefaults(t *testing.T) {
	d := Default()
	for _, c := range []*Config{d, mustParse(t, ""), mustParse(t, "# only a comment\n"), mustParse(t, "~\n")} {
		if !c.Embedded() || c.Partitions != 16 || c.Runner.Concurrency != 16 || c.Runner.LeaseTTL.D() != 15*time.Second ||
			c.Runner.ShutdownGrace.D() != 10*time.Second || c.Runner.ID == "" || c.HTTP.Listen != "127.0.0.1:8080" ||
			c.HTTP.BodyLimit != 1048576 || c.Log.Level != "info" || c.Log.Format != "text" ||
			c.Retention.D() != 168*time.Hour || c.HistoryCap != 200 || c.Redis.Prefix != "tasklease" || len(c.Jobs) != 0 ||
			c.HTTP.MaxEventClients != 100 || c.HTTP.AllowedOrigins != nil {
			t.Errorf("defaults = %+v", c)
		}
		if err := c.Validate(); err != nil {
			t.Errorf("Validate: %v", err)
		}
	}
	// No jobs → the demo jobs, which schedules may name.
	js := checkWithJobsPackage(t, d)
	if len(js) != 3 {
		t.Errorf("BuildJobs without jobs = %d jobs, want the 3 demo jobs", len(js))
	}
	c := mustParse(t, "schedules: [{name: demo, cron: '@every 1m', scope: backup, subjects: [u1]}]")
	if c.Schedules[0].Scope != "backup" {
		t.Error(c.Schedules)
	}
	ps := problemsOf(t, "schedules: [{name: demo, cron: '@every 1m', scope: photos, subjects: [u1]}]")
	wantProblem(t, ps, "schedules[0].scope", "only the demo scopes")

	// Job defaults.
	c = mustParse(t, "jobs: {j: {stages: [{name: a, exec: [x]}]}}")
	if j := c.Jobs["j"]; j.OnConflict != "join" || j.Retry != (Retry{3, Duration(time.Second), Duration(5 * time.Minute)}) {
		t.Errorf("job defaults = %+v", j)
	}
}

func TestValidation(t *testing.T) {
	const job = "jobs: {j: {stages: [{name: a, exec: [x]}]}}\n"
	tests := []struct{ yaml, path, msg string }{
		{"partitions: 0", "partitions", "must be in 1..1024"},
		{"partitions: -3", "partitions", "not in 1..1024"},
		{"runner: {concurrency: 0}", "runner.concurrency", "at least 1"},
		{"runner: {concurrency: -1}", "runner.concurrency", "at least 1"},
		{"runner: {leaseTTL: 0s}", "runner.leaseTTL", "at least 100ms"},
		{"runner: {id: 'pod a'}", "runner.id", "without spaces"},
		{"runner: {id: 'a|b'}", "runner.id", "'|'"},
		{"http: {listen: ':http'}", "http.listen", "port must be a number"},
		{"http: {listen: '127.0.0.1:99999'}", "http.listen", "port must be a number"},
		{"http: {bodyLimit: 0}", "http.bodyLimit", "at least 1 byte"},
		{"http: {bodyLimit: -5}", "http.bodyLimit", "at least 1 byte"},
		{"http: {token: \"a\\nb\"}", "http.token", "control characters"},
		{"historyCap: 0", "historyCap", "at least 1"},
		{"runner: {shutdownGrace: 0s}", "runner.shutdownGrace", "omit it for the default 10s"},
		{"jobs: {j: {retry: {backoff: 0s}, stages: [{name: a, exec: [x]}]}}", "jobs.j.retry.backoff", "must be positive"},
		{"jobs: {j: {retry: {maxBackoff: 0s}, stages: [{name: a, exec: [x]}]}}", "jobs.j.retry.maxBackoff", "must be positive"},
		{"jobs: {j: {stages: [{name: a, exec: [x], killGrace: 0s}]}}", "jobs.j.stages[0].killGrace", "default 5s"},
		{"jobs: {j: {stages: [{name: a, http: {url: 'http://h', timeout: 0s}}]}}", "jobs.j.stages[0].http.timeout", "default 30s"},
		{"retention: 0s", "retention", "must be positive"},
		{"redis: {url: 'redis://h:6379/x'}", "redis.url", "invalid database number"},
		{"redis: {url: 'redis://u:hunter2@h:bad/0'}", "redis.url", "invalid port"},
		{"redis: {url: 'redis://h?bogus=1'}", "redis.url", "unexpected option: bogus"},
		{"redis: {url: 'redis://h', addrs: ['h:1']}", "redis.addrs", "not both"},
		{"redis: {url: 'redis://h', db: 2}", "redis.db", "URL path"},
		{"redis: {url: 'redis://h', masterName: m}", "redis.masterName", "not redis.url"},
		{"redis: {masterName: m}", "redis.masterName", "needs redis.addrs"},
		{"redis: {addrs: ['h1:1', 'h2:1'], db: 1}", "redis.db", "only db 0"},
		{"redis: {addrs: ['h1']}", "redis.addrs[0]", "not host:port"},
		{"redis: {addrs: ['h1:1', 'h1:1']}", "redis.addrs[1]", "duplicate"},
		{"redis: {addrs: ['h1:1'], db: -1}", "redis.db", "negative"},
		{"redis: {prefix: 'a b'}", "redis.prefix", "must match"},
		{"redis: {addrs: ['h:1'], poolSize: 4}", "redis.poolSize", "less than runner.concurrency + 1 (17)"},
		{"redis: {poolSize: -1}", "redis.poolSize", "negative"},
		{"redis: {dialTimeout: -1s}", "redis.dialTimeout", "negative"},
		{"redis: {readTimeout: -2s}", "redis.readTimeout", "negative"},
		{"jobs: {j: }", "jobs.j", "empty job"},
		{"jobs: {j: {stages: []}}", "jobs.j.stages", "at least one stage"},
		{"jobs: {J1: {stages: [{name: a, exec: [x]}]}}", "jobs.J1", "invalid scope name"},
		{`jobs: {"a b": {stages: [{name: a, exec: [x]}]}}`, `jobs["a b"]`, "invalid scope name"},
		{"jobs: {j: {stages: [{exec: [x]}]}}", "jobs.j.stages[0].name", "required"},
		{"jobs: {j: {stages: [{name: a, exec: ['']}]}}", "jobs.j.stages[0].exec[0]", "empty program"},
		{"jobs: {j: {stages: [{name: a, exec: [x], env: {TASKLEASE_KEY: x}}]}}", "jobs.j.stages[0].env.TASKLEASE_KEY", "set by the runner"},
		{"jobs: {j: {stages: [{name: a, exec: [x], env: {'A=B': x}}]}}", `jobs.j.stages[0].env["A=B"]`, "invalid variable name"},
		{"jobs: {j: {stages: [{name: a, http: {url: 'http://h'}, dir: /tmp}]}}", "jobs.j.stages[0].dir", "only exec"},
		{"jobs: {j: {stages: [{name: a, http: {url: 'http://h'}, env: {A: b}}]}}", "jobs.j.stages[0].env", "only exec"},
		{"jobs: {j: {stages: [{name: a, http: {url: 'http://h'}, killGrace: 1s}]}}", "jobs.j.stages[0].killGrace", "only exec"},
		{"jobs: {j: {stages: [{name: a, http: {}}]}}", "jobs.j.stages[0].http.url", "required"},
		{"jobs: {j: {stages: [{name: a, http: {url: 'http://'}}]}}", "jobs.j.stages[0].http.url", "no host"},
		{"jobs: {j: {stages: [{name: a, http: {url: 'http://h', headers: {'Bad Header': x}}}]}}", `jobs.j.stages[0].http.headers["Bad Header"]`, "invalid header name"},
		{"jobs: {j: {stages: [{name: a, http: {url: 'http://h', headers: {Content-Type: x}}}]}}", "jobs.j.stages[0].http.headers.Content-Type", "set by the stage"},
		{"jobs: {j: {stages: [{name: a, http: {url: 'http://h', headers: {X-A: \"a\\rb\"}}}]}}", "jobs.j.stages[0].http.headers.X-A", "control characters"},
		{"jobs: {j: {stages: [{name: a, http: ~}]}}", "jobs.j.stages[0]", "exactly one of exec or http"},
		{"jobs: {j: {leaseTTL: 10ms, stages: [{name: a, exec: [x]}]}}", "jobs.j.leaseTTL", "below the minimum"},
		{"jobs: {j: {leaseTTL: 0s, stages: [{name: a, exec: [x]}]}}", "jobs.j.leaseTTL", "at least 100ms"},
		{"jobs: {j: {retry: {maxAttempts: -1}, stages: [{name: a, exec: [x]}]}}", "jobs.j.retry.maxAttempts", "at least 1"},
		{"jobs: {j: {retry: {backoff: 10m}, stages: [{name: a, exec: [x]}]}}", "jobs.j.retry.backoff", "longer than maxBackoff 5m0s"},
		{"jobs: {j: {retry: {maxBackoff: 100ms}, stages: [{name: a, exec: [x]}]}}", "jobs.j.retry.maxBackoff", "backoff 1s is longer"},
		{job + "schedules: [{cron: '@hourly', scope: j, subjects: all}]", "schedules[0].name", "required"},
		{job + "schedules: [{name: s, scope: j, subjects: all}]", "schedules[0].cron", "required"},
		{job + "schedules: [{name: s, cron: '* * * *', scope: j, subjects: all}]", "schedules[0].cron", "expected exactly 5 fields"},
		{job + "schedules: [{name: s, cron: '0 * * * * *', scope: j, subjects: all}]", "schedules[0].cron", "expected exactly 5 fields"},
		{job + "schedules: [{name: s, cron: '@every 100ms', scope: j, subjects: all}]", "schedules[0].cron", "at least 1s"},
		{job + "schedules: [{name: s, cron: '@yearly-ish', scope: j, subjects: all}]", "schedules[0].cron", "unrecognized descriptor"},
		{job + "schedules: [{name: s, cron: 'TZ=UTC', scope: j, subjects: all}]", "schedules[0].cron", "invalid cron expression"},
		{job + "schedules: [{name: s, cron: '@hourly', subjects: all}]", "schedules[0].scope", "required"},
		{job + "schedules: [{name: s, cron: '@hourly', scope: k, subjects: all}]", "schedules[0].scope", `"k" is not a configured job (jobs: j)`},
		{job + "schedules: [{name: s, cron: '@hourly', scope: j, subjects: all}, {name: s, cron: '@daily', scope: j, subjects: all}]", "schedules[1].name", "duplicate schedule name"},
	}
	for _, tt := range tests {
		ps := problemsOf(t, tt.yaml)
		wantProblem(t, ps, tt.path, tt.msg)
		for _, p := range ps {
			if strings.Contains(p.Message, "hunter2") {
				t.Errorf("password leaked in %v", p)
			}
		}
	}

	// Valid corner cases.
	for _, y := range []string{
		"http: {listen: ':8080'}",
		"http: {listen: '[::1]:8080'}",
		"redis: {url: 'rediss://u:p@h:6380/3?dial_timeout=2s'}",
		"redis: {url: 'unix:///tmp/redis.sock?db=2'}",
		"redis: {addrs: ['h1:1'], db: 3}",
		"redis: {addrs: ['h1:1', 'h2:1'], masterName: m, db: 2}",
		job + "schedules: [{name: s.1_a-b, cron: 'CRON_TZ=UTC 0 3 * * mon-fri', scope: j, subjects: all}]",
		"jobs: {j: {stages: [{name: a, exec: [x], timeout: 0s}], minInterval: 0s}}",
	} {
		mustParse(t, y)
	}
}

func TestAnchorsAndMerges(t *testing.T) {
	ps := problemsOf(t, `
defaults: &d {maxAttempts: 2}
jobs: {}
`)
	wantProblem(t, ps, "defaults", "unknown key")

	// Anchors inside known keys work.
	c := mustParse(t, `
jobs:
  a: &job
    retry: {maxAttempts: 2}
    stages:
      - &pull {name: pulling, exec: [sh, -c, "true"], timeout: 1m}
      - <<: *pull
        name: pushing
  b:
    <<: *job
    foreground: true
`)
	b := c.Jobs["b"]
	if !b.Foreground || b.Retry.MaxAttempts != 2 || len(b.Stages) != 2 || b.Stages[1].Name != "pushing" || b.Stages[1].Timeout.D() != time.Minute {
		t.Errorf("merged job = %+v", b)
	}
	checkWithJobsPackage(t, c)

	// Unknown keys inside a merged mapping are still found.
	ps = problemsOf(t, "jobs:\n  a:\n    stages:\n      - &s {name: a, exec: [x], tmeout: 1s}\n      - {<<: *s, name: b}\n")
	wantProblem(t, ps, "jobs.a.stages[0].tmeout", `did you mean "timeout"`)
	wantProblem(t, ps, "jobs.a.stages[1].tmeout", `did you mean "timeout"`)

	ps = problemsOf(t, "jobs:\n  a: {<<: [1]}\n")
	wantProblem(t, ps, "jobs.a", "<< merges a mapping")
}

func TestAliasBomb(t *testing.T) {
	var b strings.Builder
	b.WriteString("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n")
	for i := 1; i < 9; i++ {
		b.WriteString("a" + string(rune('0'+i)) + ": &a" + string(rune('0'+i)) + " [")
		for j := 0; j < 10; j++ {
			if j > 0 {
				b.WriteString(", ")
			}
			b.WriteString("*a" + string(rune('0'+i-1)))
		}
		b.WriteString("]\n")
	}
	// A schema path that recurses: exec lists of lists are type errors, so
	// put the bomb where lists nest in the schema (stages → exec).
	b.WriteString("jobs:\n  j:\n    stages: *a8\n")
	start := time.Now()
	_, err := Parse([]byte(b.String()))
	if err == nil {
		t.Fatal("alias bomb parsed")
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("alias bomb took %v", d)
	}
	var ps Problems
	if !errors.As(err, &ps) || len(ps) > maxProblems+1 {
		t.Errorf("problems: %d", len(ps))
	}
}

func TestSelfMerge(t *testing.T) {
	// yaml.v3 registers an anchor before its content, so a mapping can
	// merge itself; decoding must not recurse forever.
	_, err := Parse([]byte("jobs:\n  a: &a {<<: *a, stages: [{name: a, exec: [x]}]}\n"))
	if err != nil && !errors.Is(err, ErrInvalid) {
		t.Fatalf("err = %v", err)
	}
}

func TestProblemsError(t *testing.T) {
	ps := Problems{{Path: "a.b", Message: "bad"}, {Message: "yaml: line 3: oops"}}
	if got := ps.Error(); got != "a.b: bad\nyaml: line 3: oops" {
		t.Errorf("Error() = %q", got)
	}
	var err error = ps
	if !errors.Is(err, ErrInvalid) {
		t.Error("not ErrInvalid")
	}
	// Many problems are capped.
	var y strings.Builder
	y.WriteString("runner:\n")
	for i := range 150 {
		y.WriteString("  k" + strings.Repeat("x", i%7) + string(rune('a'+i%26)) + string(rune('a'+i/26)) + ": 1\n")
	}
	got := problemsOf(t, y.String())
	if len(got) != maxProblems+1 || !strings.Contains(got[maxProblems].Message, "more problems") {
		t.Errorf("%d problems, last %v", len(got), got[len(got)-1])
	}
}

// TestHTTPBrowserSettings: http.allowedOrigins and http.maxEventClients
// (DESIGN §5), checked with the parser the API uses.
func TestHTTPBrowserSettings(t *testing.T) {
	c := mustParse(t, `
http:
  allowedOrigins:
    - https://dash.example.com
    - HTTP://LOCALHOST:3000
    - "http://[::1]:9000"
  maxEventClients: 5
`)
	if want := []string{"https://dash.example.com", "HTTP://LOCALHOST:3000", "http://[::1]:9000"}; !slices.Equal(c.HTTP.AllowedOrigins, want) ||
		c.HTTP.MaxEventClients != 5 {
		t.Errorf("http = %+v", c.HTTP)
	}
	mustParse(t, "http: {allowedOrigins: [], maxEventClients: 1}")

	for _, tt := range []struct{ yaml, path, msg string }{
		{"http: {allowedOrigins: ['*']}", "http.allowedOrigins[0]", "wildcards are not allowed"},
		{"http: {allowedOrigins: ['https://*.example.com']}", "http.allowedOrigins[0]", "wildcards are not allowed"},
		{"http: {allowedOrigins: ['https://dash.example.com/']}", "http.allowedOrigins[0]", "without path"},
		{"http: {allowedOrigins: ['https://dash.example.com/app']}", "http.allowedOrigins[0]", "without path"},
		{"http: {allowedOrigins: ['dash.example.com']}", "http.allowedOrigins[0]", "not an origin"},
		{"http: {allowedOrigins: ['ftp://dash.example.com']}", "http.allowedOrigins[0]", "http or https"},
		{"http: {allowedOrigins: ['https://dash.example.com:0']}", "http.allowedOrigins[0]", "port"},
		{"http: {allowedOrigins: ['https://u:p@dash.example.com']}", "http.allowedOrigins[0]", "user info"},
		{"http: {allowedOrigins: ['']}", "http.allowedOrigins[0]", "empty origin"},
		{"http: {allowedOrigins: ['https://a.example', 'HTTPS://A.EXAMPLE:443']}", "http.allowedOrigins[1]", `duplicate origin "https://a.example" (also allowedOrigins[0])`},
		{"http: {allowedOrigins: https://a.example}", "http.allowedOrigins", "expected a list"},
		{"http: {allowedOrigins: [~]}", "http.allowedOrigins[0]", "expected a value, got null"},
		{"http: {allowedOrigins: [[x]]}", "http.allowedOrigins[0]", "expected a string"},
		{"http: {maxEventClients: 0}", "http.maxEventClients", "must be at least 1 (omit it for the default 100)"},
		{"http: {maxEventClients: -1}", "http.maxEventClients", "-1 must be at least 1"},
		{"http: {maxEventClients: many}", "http.maxEventClients", "expected an integer"},
		{"http: {maxEventClients: 1.5}", "http.maxEventClients", "expected an integer"},
		{"http: {allowedorigins: []}", "http.allowedorigins", `did you mean "allowedOrigins"`},
	} {
		wantProblem(t, problemsOf(t, tt.yaml), tt.path, tt.msg)
	}

	// Every problem at once, each with its path and line.
	ps := problemsOf(t, "http:\n  allowedOrigins:\n    - https://ok.example\n    - '*'\n    - https://x.example/\n  maxEventClients: 0\n")
	want := map[string]int{"http.allowedOrigins[1]": 4, "http.allowedOrigins[2]": 5, "http.maxEventClients": 6}
	if len(ps) != len(want) {
		t.Fatalf("want %d problems, got:\n%v", len(want), ps)
	}
	for _, p := range ps {
		if line, ok := want[p.Path]; !ok || p.Line != line {
			t.Errorf("problem %v at line %d, want one of %v", p, p.Line, want)
		}
	}

	// Built in Go (serve's flags): Validate applies the default and checks.
	d := Default()
	if d.HTTP.MaxEventClients != MaxEventClientsDefault {
		t.Errorf("default maxEventClients %d", d.HTTP.MaxEventClients)
	}
	d.HTTP.AllowedOrigins = []string{"https://dash.example.com", "*"}
	d.HTTP.MaxEventClients = -3
	var vps Problems
	if !errors.As(d.Validate(), &vps) {
		t.Fatal("Validate accepted a wildcard origin")
	}
	wantProblem(t, vps, "http.allowedOrigins[1]", "wildcards")
	wantProblem(t, vps, "http.maxEventClients", "at least 1")
}

func TestValidateAfterChange(t *testing.T) {
	c := mustParse(t, "redis: {addrs: ['h1:1', 'h2:1']}")
	c.Redis.URL = "redis://h:6379" // e.g. --redis from the command line
	err := c.Validate()
	var ps Problems
	if !errors.As(err, &ps) {
		t.Fatalf("Validate = %v", err)
	}
	wantProblem(t, ps, "redis.addrs", "not both")
	c.Redis.Addrs = nil
	if err := c.Validate(); err != nil {
		t.Errorf("Validate = %v", err)
	}
}

func TestRedisOptions(t *testing.T) {
	def := max(10*runtime.GOMAXPROCS(0), 16+16+16)

	o := Default().RedisOptions()
	if len(o.Addrs) != 0 || o.PoolSize != def {
		t.Errorf("embedded options = %+v", o)
	}

	c := mustParse(t, "redis: {url: 'rediss://user:pw@cache.example:6380/4?dial_timeout=3s', password: override}\nrunner: {concurrency: 100}\npartitions: 64")
	o = c.RedisOptions()
	if !slices.Equal(o.Addrs, []string{"cache.example:6380"}) || o.Username != "user" || o.Password != "override" || o.DB != 4 ||
		o.TLSConfig == nil || o.TLSConfig.ServerName != "cache.example" || o.DialTimeout != 3*time.Second || o.MasterName != "" {
		t.Errorf("url options = %+v", o)
	}
	if want := max(10*runtime.GOMAXPROCS(0), 100+64+16); o.PoolSize != want {
		t.Errorf("pool size = %d, want %d", o.PoolSize, want)
	}

	c = mustParse(t, "redis: {addrs: ['a:1', 'b:1', 'c:1'], username: u, password: p, poolSize: 50}")
	o = c.RedisOptions()
	if len(o.Addrs) != 3 || o.MasterName != "" || o.Username != "u" || o.Password != "p" || o.PoolSize != 50 {
		t.Errorf("cluster options = %+v", o)
	}
	if _, ok := redis.NewUniversalClient(o).(*redis.ClusterClient); !ok {
		t.Error("three addrs do not make a cluster client")
	}

	c = mustParse(t, "redis: {addrs: ['s1:26379', 's2:26379'], masterName: mymaster, db: 2}")
	o = c.RedisOptions()
	if o.MasterName != "mymaster" || o.DB != 2 || len(o.Addrs) != 2 {
		t.Errorf("sentinel options = %+v", o)
	}
	cl := redis.NewUniversalClient(o)
	if _, ok := cl.(*redis.Client); !ok { // a failover client is a *redis.Client
		t.Errorf("sentinel client = %T", cl)
	}
	_ = cl.Close()

	c = mustParse(t, "redis: {addrs: ['a:1', 'b:1', 'c:1'], dialTimeout: 1s, readTimeout: 1500ms}")
	if o := c.RedisOptions(); o.DialTimeout != time.Second || o.ReadTimeout != 1500*time.Millisecond || o.WriteTimeout != 1500*time.Millisecond {
		t.Errorf("timeouts = dial %s read %s write %s", o.DialTimeout, o.ReadTimeout, o.WriteTimeout)
	}

	c = mustParse(t, "redis: {url: 'redis://h:1?pool_size=7'}")
	if o := c.RedisOptions(); o.PoolSize != 7 {
		t.Errorf("pool_size from url = %d", o.PoolSize)
	}
}

// TestRedisAddressMap: a client built from a config with addressMap
// reaches the node through the mapped address, and only there.
func TestRedisAddressMap(t *testing.T) {
	mr := miniredis.RunT(t)
	const announced = "10.255.0.1:6379" // not reachable from here
	c := mustParse(t, fmt.Sprintf("redis: {url: 'redis://%s', dialTimeout: 300ms, addressMap: {'%s': '%s'}}", announced, announced, mr.Addr()))
	rdb := redis.NewUniversalClient(c.RedisOptions())
	defer rdb.Close()
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("PING through the address map: %v", err)
	}
	delete(c.Redis.AddressMap, announced)
	direct := redis.NewUniversalClient(c.RedisOptions())
	defer direct.Close()
	if err := direct.Ping(context.Background()).Err(); err == nil {
		t.Fatal("PING without the map reached the unreachable address")
	}

	ps := problemsOf(t, "redis: {url: 'redis://h:1', addressMap: {'h:1': 'nope', ':2': 'x:3'}}")
	wantProblem(t, ps, "redis.addressMap.h:1", "not host:port")
	wantProblem(t, ps, "redis.addressMap.:2", "host")
}

func TestBuildJobs(t *testing.T) {
	c := mustParse(t, `
runner: {id: pod-a, concurrency: 4, leaseTTL: 3s, shutdownGrace: 2s}
partitions: 8
retention: 48h
historyCap: 50
redis: {prefix: app1}
jobs:
  zeta:
    onConflict: replace
    minInterval: 1m
    leaseTTL: 1s
    retry: {maxAttempts: 1, backoff: 2s, maxBackoff: 1m}
    stages:
      - {name: run, exec: [env], dir: /tmp, env: {B: "2", A: "1"}, killGrace: 2s, timeout: 10s}
  alpha:
    stages:
      - {name: call, http: {url: "https://api.example/hook", headers: {X-Key: k}}}
`)
	js := checkWithJobsPackage(t, c)
	if js[0].Scope != "alpha" || js[1].Scope != "zeta" {
		t.Fatalf("not sorted by scope: %v, %v", js[0].Scope, js[1].Scope)
	}
	h := js[0].Stages[0].Handler.(*jobs.HTTPStage)
	if h.URL != "https://api.example/hook" || h.Header["X-Key"] != "k" || h.Client != nil {
		t.Errorf("http stage = %+v", h)
	}
	z := js[1]
	e := z.Stages[0].Handler.(*jobs.ExecStage)
	if !slices.Equal(e.Env, []string{"A=1", "B=2"}) || e.Dir != "/tmp" || e.KillGrace != 2*time.Second || z.Stages[0].Timeout != 10*time.Second {
		t.Errorf("exec stage = %+v", e)
	}
	if z.OnConflict != jobs.PolicyReplace || z.MinInterval != time.Minute || z.LeaseTTL != time.Second ||
		z.Retry != (jobs.RetryPolicy{MaxAttempts: 1, Backoff: 2 * time.Second, MaxBackoff: time.Minute}) {
		t.Errorf("job = %+v", z)
	}
	// The built jobs do not alias the config.
	e.Command[0] = "changed"
	if c.Jobs["zeta"].Stages[0].Exec[0] != "env" {
		t.Error("BuildJobs shares the exec slice with the config")
	}
	if rc := c.RunnerConfig(); rc != (jobs.RunnerConfig{ID: "pod-a", Concurrency: 4, LeaseTTL: 3 * time.Second, ShutdownGrace: 2 * time.Second}) {
		t.Errorf("RunnerConfig = %+v", rc)
	}
	if rc := c.RegistryConfig(); rc.Prefix != "app1" || rc.Partitions != 8 || rc.HistoryCap != 50 || rc.Retention != 48*time.Hour || rc.Jobs != nil {
		t.Errorf("RegistryConfig = %+v", rc)
	}

	// A config built in Go without validation fails cleanly.
	bad := &Config{Jobs: map[string]*Job{"x": {Stages: []Stage{{Name: "a"}}}}}
	if _, err := bad.BuildJobs(); !errors.Is(err, ErrInvalid) {
		t.Errorf("BuildJobs of an invalid config = %v", err)
	}
}

func TestDemoJobs(t *testing.T) {
	js := DemoJobs()
	var scopes []string
	for _, j := range js {
		scopes = append(scopes, j.Scope)
		if !slices.Equal(j.StageNames(), []string{"pulling", "pushing"}) || j.OnConflict != jobs.PolicyJoin ||
			j.MinInterval != 0 || j.Retry.MaxAttempts != 3 {
			t.Errorf("demo job %+v", j)
		}
		if want := j.Scope != "backup"; j.Foreground != want {
			t.Errorf("%s foreground = %v", j.Scope, j.Foreground)
		}
	}
	if !slices.Equal(scopes, demoScopes) {
		t.Errorf("scopes = %v, want %v", scopes, demoScopes)
	}
	// A stage honours ctx: cancelled, it returns at once with the cause.
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(jobs.ErrCancelled)
	start := time.Now()
	err := js[0].Stages[0].Handler.RunStage(ctx, &jobs.Run{})
	if !errors.Is(err, jobs.ErrCancelled) || time.Since(start) > 500*time.Millisecond {
		t.Errorf("cancelled demo stage = %v after %v", err, time.Since(start))
	}
}

func TestLog(t *testing.T) {
	var b strings.Builder
	l := Log{Level: "warn", Format: "json"}.NewLogger(&b)
	l.Info("hidden")
	l.Warn("shown")
	if out := b.String(); strings.Contains(out, "hidden") || !strings.Contains(out, `"msg":"shown"`) {
		t.Errorf("log output = %q", out)
	}
}

func TestLoadErrors(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "missing.yaml"))
	if err == nil || errors.Is(err, ErrInvalid) || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load(missing) = %v", err)
	}
	ps := problemsOf(t, strings.Repeat("#", maxConfigSize+1))
	wantProblem(t, ps, "", "more than")
}

// TestTagsComplete guards the decoder's assumption that every field has an
// explicit yaml tag (the yaml default would lowercase maxBackoff).
func TestTagsComplete(t *testing.T) {
	for _, typ := range []reflect.Type{
		reflect.TypeFor[Config](), reflect.TypeFor[Redis](), reflect.TypeFor[Runner](), reflect.TypeFor[HTTP](),
		reflect.TypeFor[Log](), reflect.TypeFor[Job](), reflect.TypeFor[Retry](), reflect.TypeFor[Stage](),
		reflect.TypeFor[HTTPStage](), reflect.TypeFor[Schedule](), reflect.TypeFor[Limiter](), reflect.TypeFor[Fairness](),
	} {
		for i := range typ.NumField() {
			if f := typ.Field(i); f.Tag.Get("yaml") == "" {
				t.Errorf("%s.%s has no yaml tag", typ.Name(), f.Name)
			}
		}
	}
}

func TestTracingOn(t *testing.T) {
	env := func(kv ...string) func(string) string {
		return func(k string) string {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1]
				}
			}
			return ""
		}
	}
	on, err := Parse([]byte("tracing: {enabled: true, serviceName: svc}\n"))
	if err != nil {
		t.Fatal(err)
	}
	off, err := Parse([]byte("log: {level: info}\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		c    *Config
		env  func(string) string
		want bool
	}{
		{on, env(), true},
		{off, env(), false},
		{off, env("OTEL_TRACES_EXPORTER", "otlp"), true},
		{off, env("OTEL_TRACES_EXPORTER", "console"), true},
		{off, env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318"), true},
		{off, env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://collector:4318/v1/traces"), true},
		{on, env("OTEL_SDK_DISABLED", "true"), false},
		{on, env("OTEL_TRACES_EXPORTER", "none"), false},
	} {
		if got := tc.c.TracingOn(tc.env); got != tc.want {
			t.Errorf("enabled=%v env: TracingOn = %v, want %v", tc.c.Tracing.Enabled, got, tc.want)
		}
	}
	if on.Tracing.ServiceName != "svc" {
		t.Errorf("serviceName %q", on.Tracing.ServiceName)
	}
	if _, err := Parse([]byte("tracing: {enabeld: true}\n")); err == nil {
		t.Error("a misspelt tracing key was accepted")
	}
}

// A job's debounce: defaults, bounds and the problems' paths.
func TestDebounceConfig(t *testing.T) {
	const job = "jobs: {j: {%s stages: [{name: a, exec: [x]}]}}\n"
	c := mustParse(t, fmt.Sprintf(job, "debounce: 5s,"))
	js, err := c.BuildJobs()
	if err != nil {
		t.Fatal(err)
	}
	if js[0].Debounce != 5*time.Second {
		t.Errorf("debounce %v, want 5s", js[0].Debounce)
	}
	for _, c := range []struct{ body, path, msg string }{
		{"debounce: -1s,", "jobs.j.debounce", "negative"},
		{"debounce: 2m, debounceMax: 1m,", "jobs.j.debounceMax", "below debounce"},
		{"debounce: 1000h,", "jobs.j.debounce", "up to"},
	} {
		_, err := Parse([]byte(fmt.Sprintf(job, c.body)))
		if err == nil || !strings.Contains(err.Error(), c.path) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: %v, want a problem at %s saying %q", c.body, err, c.path, c.msg)
		}
	}
}

// TestHTTPAppAccess: http.readToken, http.subjectTokens and
// http.maxSubjectStreams (DESIGN §12).
func TestHTTPAppAccess(t *testing.T) {
	secret := strings.Repeat("s", 32)
	c := mustParse(t, `
http:
  token: op
  readToken: ro
  subjectTokens:
    hmacSecret: `+secret+`
    jwksURL: https://idp.example.com/.well-known/jwks.json
    issuer: https://idp.example.com/
    audience: tasklease
  maxSubjectStreams: 500
`)
	st := c.HTTP.SubjectTokens
	if c.HTTP.ReadToken != "ro" || st.HMACSecret != secret || st.Audience != "tasklease" || st.SubjectClaim != "sub" || c.HTTP.MaxSubjectStreams != 500 {
		t.Errorf("http = %+v", c.HTTP)
	}
	if d := mustParse(t, "http: {}"); d.HTTP.MaxSubjectStreams != MaxSubjectStreamsDefault || d.HTTP.SubjectTokens.Enabled() {
		t.Errorf("defaults %+v", d.HTTP)
	}
	mustParse(t, "http: {subjectTokens: {jwksURL: 'http://127.0.0.1:9/jwks', audience: a, subjectClaim: user_id}}")
	for _, tt := range []struct{ yaml, path, msg string }{
		{"http: {maxSubjectStreams: 0}", "http.maxSubjectStreams", "must be at least 1 (omit it for the default 10000)"},
		{"http: {maxSubjectStreams: -2}", "http.maxSubjectStreams", "-2 must be at least 1"},
		{"http: {token: a, readToken: a}", "http.readToken", "must differ from http.token"},
		{"http: {readToken: \"a\\nb\"}", "http.readToken", "control characters"},
		{"http: {subjectTokens: {hmacSecret: short}}", "http.subjectTokens.hmacSecret", "at least 32"},
		{"http: {subjectTokens: {hmacSecret: ''}}", "http.subjectTokens.hmacSecret", "is empty (an unset environment variable?)"},
		{"http: {subjectTokens: {audience: tasklease}}", "http.subjectTokens", "without hmacSecret or jwksURL"},
		{"http: {token: " + secret + ", subjectTokens: {hmacSecret: " + secret + "}}", "http.subjectTokens.hmacSecret", "must differ"},
		{"http: {subjectTokens: {jwksURL: 'https://idp.example.com/jwks'}}", "http.subjectTokens.audience", "required with jwksURL"},
		{"http: {subjectTokens: {jwksURL: 'http://idp.example.com/jwks', audience: a}}", "http.subjectTokens.jwksURL", "must be https"},
		{"http: {subjectTokens: {jwksURL: 'idp', audience: a}}", "http.subjectTokens.jwksURL", "is not a URL"},
		{"http: {subjectTokens: {hmacSecret: " + secret + ", subjectClaim: exp}}", "http.subjectTokens.subjectClaim", "another meaning"},
		{"http: {subjectTokens: {hmacSecret: " + secret + ", subjectclaim: x}}", "http.subjectTokens.subjectclaim", `did you mean "subjectClaim"`},
	} {
		wantProblem(t, problemsOf(t, tt.yaml), tt.path, tt.msg)
	}
}
