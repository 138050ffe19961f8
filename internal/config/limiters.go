package config

import (
	"slices"
	"strings"
	"time"

	"github.com/tasklease/tasklease/jobs"
)

// Flow control (DESIGN §11): the top-level limiters, and each job's own
// limits and fair share. The jobs package checks the same things again
// when the registry is built (jobs.ErrConfig); here every problem gets
// its path.

// separatorMax bounds a fairness separator.
const separatorMax = 16

// Fair-share groupings (jobs.FairnessBy).
var groupBys = []string{string(jobs.FairnessSubjectPrefix), string(jobs.FairnessRequest)}

// checkLimits reports the problems of a concurrency, rate and burst under
// path p (a limiter, or a job's own limits).
func checkLimits(ps *problemSet, p string, concurrency int, rate string, burst int) {
	if concurrency < 0 || concurrency > jobs.ConcurrencyMax {
		ps.addf(p+".concurrency", "%d is not in 0..%d (0: no cap)", concurrency, jobs.ConcurrencyMax)
	}
	if rate != "" {
		if _, err := jobs.ParseRate(rate); err != nil {
			ps.addf(p+".rate", "invalid rate %q: want N/s, N/m or N/h with N at least 1, e.g. 20/s", truncate(rate, 40))
		}
	}
	switch {
	case burst < 0 || burst > jobs.BurstMax:
		ps.addf(p+".burst", "%d is not in 1..%d", burst, jobs.BurstMax)
	case burst > 0 && rate == "":
		ps.addf(p+".burst", "a burst needs a rate (set rate, e.g. 20/s)")
	}
}

// validateLimiters checks the top-level limiters.
func (c *Config) validateLimiters(ps *problemSet) {
	for _, name := range sortedLimiters(c.Limiters) {
		p := keyPath("limiters", name)
		if !jobs.ValidLimiterName(name) {
			ps.addf(p, "invalid limiter name (want %s)", jobs.LimiterNamePattern)
		}
		l := c.Limiters[name]
		if l == nil {
			ps.addf(p, "empty limiter: set concurrency, rate or both")
			continue
		}
		checkLimits(ps, p, l.Concurrency, l.Rate, l.Burst)
		if l.Concurrency == 0 && l.Rate == "" && !ps.broken[p+".concurrency"] && !ps.broken[p+".rate"] {
			ps.addf(p, "limits nothing: set concurrency, rate or both")
		}
	}
}

// validateJobLimits checks a job's limiters, own limits and fairness.
func (c *Config) validateJobLimits(ps *problemSet, p string, j *Job) {
	seen := map[string]int{}
	for i, name := range j.Limiters {
		lp := indexPath(p+".limiters", i)
		if first, dup := seen[name]; dup {
			ps.addf(lp, "limiter %q listed twice (also limiters[%d])", truncate(name, 70), first)
			continue
		}
		seen[name] = i
		if _, ok := c.Limiters[name]; !ok {
			if len(c.Limiters) == 0 {
				ps.addf(lp, "%q is not a limiter: no limiters are configured (top-level limiters)", truncate(name, 70))
			} else {
				ps.addf(lp, "%q is not a limiter (limiters: %s)", truncate(name, 70), strings.Join(sortedLimiters(c.Limiters), ", "))
			}
		}
	}
	checkLimits(ps, p, j.Concurrency, j.Rate, j.Burst)
	f := j.Fairness
	if f == nil {
		return
	}
	fp := p + ".fairness"
	switch {
	case f.GroupBy == "":
		ps.addf(fp+".groupBy", "required: %s", strings.Join(groupBys, " or "))
	case !slices.Contains(groupBys, f.GroupBy):
		ps.addf(fp+".groupBy", "%q is not one of %s", truncate(f.GroupBy, 40), strings.Join(groupBys, ", "))
	case f.GroupBy == string(jobs.FairnessRequest) && ps.set[fp+".separator"]:
		ps.addf(fp+".separator", "only groupBy subjectPrefix has a separator")
	}
	if ps.set[fp+".separator"] && !validSeparator(f.Separator) {
		ps.addf(fp+".separator", "%q: want 1..%d characters that subjects contain (letters, digits, '.', '_', '@', ':', '-'), or omit it for \":\"",
			truncate(f.Separator, 40), separatorMax)
	}
	if len(j.Limiters) == 0 && j.Concurrency == 0 && j.Rate == "" {
		ps.addf(fp, "groups take turns only while runs wait for a limiter, and this job uses none: set limiters, concurrency or rate")
	}
}

// validSeparator reports whether s can end a subject's prefix: a separator
// no subject can contain would leave every subject a group of its own.
func validSeparator(s string) bool {
	if s == "" || len(s) > separatorMax {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("._@:-", c) >= 0) {
			return false
		}
	}
	return true
}

// sortedLimiters returns the limiter names in order.
func sortedLimiters(m map[string]*Limiter) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// buildRate turns a rate and burst into a jobs.Rate. A rate that does not
// parse (a config that was not validated) becomes one the jobs package
// refuses, so it fails NewRegistry instead of silently limiting nothing.
func buildRate(rate string, burst int) jobs.Rate {
	r, err := jobs.ParseRate(rate)
	if err != nil {
		return jobs.Rate{Count: -1, Per: time.Second}
	}
	r.Burst = burst // without a rate, the jobs package refuses a burst too
	return r
}

// buildLimiters returns the configured limiters as the jobs package takes
// them, by name.
func (c *Config) buildLimiters() []jobs.Limiter {
	if len(c.Limiters) == 0 {
		return nil
	}
	out := make([]jobs.Limiter, 0, len(c.Limiters))
	for _, name := range sortedLimiters(c.Limiters) {
		l := c.Limiters[name]
		if l == nil {
			l = &Limiter{}
		}
		out = append(out, jobs.Limiter{Name: name, Concurrency: l.Concurrency, Rate: buildRate(l.Rate, l.Burst),
			HoldOnRetryAfter: l.HoldOnRetryAfter})
	}
	return out
}

// buildJobLimits sets a built job's limiters, limits and fairness from j.
func buildJobLimits(job *jobs.Job, j *Job) {
	job.Limiters = slices.Clone(j.Limiters)
	job.Concurrency = j.Concurrency
	job.Rate = buildRate(j.Rate, j.Burst)
	if f := j.Fairness; f != nil {
		job.Fairness = jobs.Fairness{GroupBy: jobs.FairnessBy(f.GroupBy), Separator: f.Separator}
	}
}
