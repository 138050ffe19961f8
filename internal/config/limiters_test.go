package config

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tasklease/tasklease/jobs"
)

// flowConfig is DESIGN §11's example, with a second job sharing the
// limiter.
const flowConfig = `
limiters:
  remote_store: {concurrency: 50, rate: 20/s, burst: 10, holdOnRetryAfter: true}
  slow-api: {rate: 5/m}
jobs:
  course_sync:
    limiters: [remote_store]
    concurrency: 100
    rate: 50/s
    fairness: {groupBy: subjectPrefix, separator: ":"}
    stages: [{name: a, exec: [x]}]
  message_sync:
    limiters: [remote_store, slow-api]
    fairness: {groupBy: request}
    stages: [{name: a, exec: [x]}]
  backup:
    stages: [{name: a, exec: [x]}]
`

// The limiters and the jobs' limits reach jobs.Config and jobs.Job, and
// the jobs package accepts them.
func TestLimitersConfig(t *testing.T) {
	c := mustParse(t, flowConfig)
	rc := c.RegistryConfig()
	want := []jobs.Limiter{
		{Name: "remote_store", Concurrency: 50, Rate: jobs.Rate{Count: 20, Per: time.Second, Burst: 10}, HoldOnRetryAfter: true},
		{Name: "slow-api", Rate: jobs.Rate{Count: 5, Per: time.Minute}},
	}
	if !slices.Equal(rc.Limiters, want) {
		t.Errorf("RegistryConfig().Limiters = %+v, want %+v", rc.Limiters, want)
	}
	js := checkWithJobsPackage(t, c)
	byScope := map[string]jobs.Job{}
	for _, j := range js {
		byScope[j.Scope] = j
	}
	cs := byScope["course_sync"]
	if !slices.Equal(cs.Limiters, []string{"remote_store"}) || cs.Concurrency != 100 ||
		cs.Rate != (jobs.Rate{Count: 50, Per: time.Second}) ||
		cs.Fairness != (jobs.Fairness{GroupBy: jobs.FairnessSubjectPrefix, Separator: ":"}) {
		t.Errorf("course_sync limits: %+v %d %+v %+v", cs.Limiters, cs.Concurrency, cs.Rate, cs.Fairness)
	}
	ms := byScope["message_sync"]
	if !slices.Equal(ms.Limiters, []string{"remote_store", "slow-api"}) || ms.Concurrency != 0 || !ms.Rate.IsZero() ||
		ms.Fairness != (jobs.Fairness{GroupBy: jobs.FairnessRequest}) {
		t.Errorf("message_sync limits: %+v %d %+v %+v", ms.Limiters, ms.Concurrency, ms.Rate, ms.Fairness)
	}
	if b := byScope["backup"]; b.Limiters != nil || b.Concurrency != 0 || !b.Rate.IsZero() || b.Fairness != (jobs.Fairness{}) {
		t.Errorf("backup, without limits: %+v", b)
	}
	// The built job does not share the config's list.
	cs.Limiters[0] = "changed"
	if c.Jobs["course_sync"].Limiters[0] != "remote_store" {
		t.Error("BuildJobs shares the limiters slice with the config")
	}
	// No limiters: none in the registry config.
	if rc := mustParse(t, "jobs: {j: {stages: [{name: a, exec: [x]}]}}").RegistryConfig(); rc.Limiters != nil {
		t.Errorf("limiters without any configured: %+v", rc.Limiters)
	}
}

// Every flow-control mistake is a problem at its path.
func TestLimitersValidation(t *testing.T) {
	const stages = "stages: [{name: a, exec: [x]}]"
	lim := func(body string) string { return "limiters: {l: " + body + "}\n" }
	job := func(body string) string {
		return "limiters: {l: {concurrency: 1}}\njobs: {j: {" + body + ", " + stages + "}}\n"
	}
	for _, tc := range []struct{ yaml, path, msg string }{
		{lim("{rate: 20/x}"), "limiters.l.rate", `invalid rate "20/x"`},
		{lim("{rate: 0/s}"), "limiters.l.rate", "invalid rate"},
		{lim("{rate: fast}"), "limiters.l.rate", "want N/s, N/m or N/h"},
		{lim("{rate: 20}"), "limiters.l.rate", "invalid rate"},
		{lim("{concurrency: -1}"), "limiters.l.concurrency", "not in 0..100000"},
		{lim("{concurrency: 100001}"), "limiters.l.concurrency", "not in 0..100000"},
		{lim("{rate: 1/s, burst: -1}"), "limiters.l.burst", "not in 1..1000000"},
		{lim("{rate: 1/s, burst: 1000001}"), "limiters.l.burst", "not in 1..1000000"},
		{lim("{rate: 1/s, burst: 0}"), "limiters.l.burst", "at least 1"},
		{lim("{concurrency: 5, burst: 3}"), "limiters.l.burst", "needs a rate"},
		{lim("{holdOnRetryAfter: true}"), "limiters.l", "limits nothing"},
		{lim("{}"), "limiters.l", "limits nothing"},
		{lim("{concurrency: 0}"), "limiters.l", "limits nothing"},
		{"limiters: {l: }\n", "limiters.l", "empty limiter"},
		{"limiters: {Bad: {concurrency: 1}}\n", "limiters.Bad", "invalid limiter name"},
		{`limiters: {"job.x": {concurrency: 1}}` + "\n", `limiters["job.x"]`, "invalid limiter name"},
		{lim("{concurrency: 1, rates: 1/s}"), "limiters.l.rates", `did you mean "rate"`},
		{lim("{concurrency: many}"), "limiters.l.concurrency", "expected an integer"},
		{"jobs: {j: {limiters: [nope], " + stages + "}}\n", "jobs.j.limiters[0]", "no limiters are configured"},
		{job("limiters: [l, nope]"), "jobs.j.limiters[1]", `"nope" is not a limiter (limiters: l)`},
		{job("limiters: [l, l]"), "jobs.j.limiters[1]", "listed twice (also limiters[0])"},
		{job("limiters: l"), "jobs.j.limiters", "expected a list"},
		{job("concurrency: -5"), "jobs.j.concurrency", "not in 0..100000"},
		{job("concurrency: 200000"), "jobs.j.concurrency", "not in 0..100000"},
		{job("rate: 50/d"), "jobs.j.rate", `invalid rate "50/d"`},
		{job("rate: 5/s, burst: -2"), "jobs.j.burst", "not in 1..1000000"},
		{job("rate: 5/s, burst: 0"), "jobs.j.burst", "at least 1"},
		{job("burst: 10"), "jobs.j.burst", "needs a rate"},
		{job("concurrency: 10, burst: 10"), "jobs.j.burst", "needs a rate"},
		{job("limiters: [l], fairness: {groupBy: tenant}"), "jobs.j.fairness.groupBy", `"tenant" is not one of subjectPrefix, request`},
		{job("limiters: [l], fairness: {separator: ':'}"), "jobs.j.fairness.groupBy", "required"},
		{job("limiters: [l], fairness: {}"), "jobs.j.fairness.groupBy", "required"},
		{job("limiters: [l], fairness: {groupBy: request, separator: ':'}"), "jobs.j.fairness.separator", "only groupBy subjectPrefix"},
		{job("limiters: [l], fairness: {groupBy: subjectPrefix, separator: ''}"), "jobs.j.fairness.separator", "want 1..16 characters"},
		{job("limiters: [l], fairness: {groupBy: subjectPrefix, separator: '/'}"), "jobs.j.fairness.separator", "want 1..16 characters"},
		{job("fairness: {groupBy: subjectPrefix}"), "jobs.j.fairness", "this job uses none"},
		{job("limiters: [l], fairness: {groupby: request}"), "jobs.j.fairness.groupby", `did you mean "groupBy"`},
	} {
		ps := problemsOf(t, tc.yaml)
		wantProblem(t, ps, tc.path, tc.msg)
	}

	// Valid corner cases, each accepted by the jobs package too.
	for _, y := range []string{
		lim("{concurrency: 100000}"),
		lim("{rate: 1000000/s, burst: 1000000}"),
		lim("{rate: 1/h}"),
		lim("{concurrency: 0, rate: 1/m}"),
		job("concurrency: 0"),
		job("rate: 3/m"),
		job("concurrency: 1, fairness: {groupBy: subjectPrefix, separator: '@'}"),
		job("rate: 1/s, burst: 1, fairness: {groupBy: request}"),
		"limiters: {unused: {concurrency: 1}}\n", // a limiter no job uses (with the demo jobs)
	} {
		checkWithJobsPackage(t, mustParse(t, y))
	}
}

// TestExampleLimiters uncomments the example's flow-control lines (the
// limiters section and course_sync's limits), so the documented snippet is
// known to be valid and to mean what DESIGN §11 says.
func TestExampleLimiters(t *testing.T) {
	clearEnv(t)
	data, err := os.ReadFile(examplePath)
	if err != nil {
		t.Fatal(err)
	}
	commented := regexp.MustCompile(`^(\s*)# ((?:limiters|concurrency|rate|burst|fairness):.*|  remote_store:.*)$`)
	lines := strings.Split(string(data), "\n")
	n := 0
	for i, l := range lines {
		if m := commented.FindStringSubmatch(l); m != nil {
			lines[i] = m[1] + m[2]
			n++
		}
	}
	if n != 7 {
		t.Fatalf("uncommented %d lines, want the 2 of limiters and the 5 of course_sync", n)
	}
	c := mustParse(t, strings.Join(lines, "\n"))
	rc := c.RegistryConfig()
	want := []jobs.Limiter{{Name: "remote_store", Concurrency: 50, Rate: jobs.Rate{Count: 20, Per: time.Second, Burst: 10}, HoldOnRetryAfter: true}}
	if !slices.Equal(rc.Limiters, want) {
		t.Errorf("limiters = %+v, want %+v", rc.Limiters, want)
	}
	js := checkWithJobsPackage(t, c)
	cs := js[1]
	if cs.Scope != "course_sync" || !slices.Equal(cs.Limiters, []string{"remote_store"}) || cs.Concurrency != 100 ||
		cs.Rate != (jobs.Rate{Count: 50, Per: time.Second, Burst: 10}) ||
		cs.Fairness != (jobs.Fairness{GroupBy: jobs.FairnessSubjectPrefix, Separator: ":"}) {
		t.Errorf("course_sync = %+v", cs)
	}
}
