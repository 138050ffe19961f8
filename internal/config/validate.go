package config

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
	"github.com/robfig/cron/v3"

	"github.com/tasklease/tasklease/checkpoints"
	"github.com/tasklease/tasklease/internal/apptoken"
	"github.com/tasklease/tasklease/internal/httpapi"
	"github.com/tasklease/tasklease/internal/keyspace"
	"github.com/tasklease/tasklease/jobs"
	"github.com/tasklease/tasklease/taskkey"
	"github.com/tasklease/tasklease/triggers"
)

// runnerIDMax mirrors jobs.RunnerConfig's limit on runner ids.
const runnerIDMax = 100

var scheduleNameRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,63}$`) })

// ParseCron parses a schedule's cron expression exactly as the scheduler
// will (triggers.ParseCron), so validation and triggers always agree.
func ParseCron(spec string) (cron.Schedule, error) {
	if strings.TrimSpace(spec) == "" {
		return nil, errors.New("empty cron expression")
	}
	sched, err := triggers.ParseCron(spec)
	if err != nil {
		return nil, fmt.Errorf("invalid cron expression %q: %w", truncate(spec, 60), err)
	}
	return sched, nil
}

// checkExplicitZeros reports zeros written in the file for settings where
// zero means "default" in Go but is no sensible value in YAML
// ("concurrency: 0" is a mistake, not a request for 16).
func (c *Config) checkExplicitZeros(ps *problemSet) {
	zero := func(path string, isZero bool, msg string) {
		if isZero && ps.set[path] {
			ps.addf(path, "%s", msg)
		}
	}
	zero("partitions", c.Partitions == 0, fmt.Sprintf("must be in 1..%d", PartitionsMax))
	zero("runner.concurrency", c.Runner.Concurrency == 0, "must be at least 1")
	zero("runner.execStarts", c.Runner.ExecStarts == 0, "must be at least 1 (omit it for the default)")
	zero("runner.leaseTTL", c.Runner.LeaseTTL == 0, "must be at least "+LeaseTTLMin.String())
	zero("http.bodyLimit", c.HTTP.BodyLimit == 0, "must be at least 1 byte")
	zero("http.maxEventClients", c.HTTP.MaxEventClients == 0, fmt.Sprintf("must be at least 1 (omit it for the default %d)", MaxEventClientsDefault))
	zero("http.maxSubjectStreams", c.HTTP.MaxSubjectStreams == 0, fmt.Sprintf("must be at least 1 (omit it for the default %d)", MaxSubjectStreamsDefault))
	zero("retention", c.Retention == 0, "must be positive")
	zero("historyCap", c.HistoryCap == 0, "must be at least 1")
	zero("runner.shutdownGrace", c.Runner.ShutdownGrace == 0, "must be positive (omit it for the default 10s)")
	const burstZero = "must be at least 1 (omit it for the default 1)"
	for name, l := range c.Limiters {
		if l != nil {
			zero(keyPath("limiters", name)+".burst", l.Burst == 0, burstZero)
		}
	}
	for scope, j := range c.Jobs {
		if j == nil {
			continue
		}
		p := keyPath("jobs", scope)
		zero(p+".burst", j.Burst == 0, burstZero)
		zero(p+".retry.maxAttempts", j.Retry.MaxAttempts == 0, "must be at least 1 (1 disables retries)")
		zero(p+".retry.backoff", j.Retry.Backoff == 0, "must be positive (omit it for the default 1s)")
		zero(p+".retry.maxBackoff", j.Retry.MaxBackoff == 0, "must be positive (omit it for the default 5m)")
		zero(p+".leaseTTL", j.LeaseTTL == 0, "must be at least "+LeaseTTLMin.String()+" (omit it to use runner.leaseTTL)")
		for i, s := range j.Stages {
			sp := indexPath(p+".stages", i)
			if s.Exec != nil {
				zero(sp+".killGrace", s.KillGrace == 0, "must be positive (omit it for the default 5s)")
			}
			if s.HTTP != nil {
				zero(sp+".http.timeout", s.HTTP.Timeout == 0, "must be positive (omit it for the default 30s)")
			}
		}
	}
}

// validate checks a config whose defaults are applied.
func (c *Config) validate(ps *problemSet) {
	c.validateRedis(ps)
	if c.Partitions < 1 || c.Partitions > PartitionsMax {
		ps.addf("partitions", "%d is not in 1..%d", c.Partitions, PartitionsMax)
	}
	c.validateRunner(ps)
	c.validateHTTP(ps)
	switch c.Log.Level {
	case "debug", "info", "warn", "error":
	default:
		ps.addf("log.level", "%q is not one of debug, info, warn, error", c.Log.Level)
	}
	switch c.Log.Format {
	case "text", "json":
	default:
		ps.addf("log.format", "%q is not one of text, json", c.Log.Format)
	}
	if c.Retention <= 0 {
		ps.addf("retention", "must be positive")
	}
	if c.HistoryCap < 1 {
		ps.addf("historyCap", "%d must be at least 1", c.HistoryCap)
	}
	c.validateLimiters(ps)
	for _, scope := range sortedScopes(c.Jobs) {
		validateJob(ps, scope, c.Jobs[scope])
		if j := c.Jobs[scope]; j != nil {
			c.validateJobLimits(ps, keyPath("jobs", scope), j)
		}
	}
	c.validateSchedules(ps)
}

func (c *Config) validateRedis(ps *problemSet) {
	r := &c.Redis
	if r.URL != "" && len(r.Addrs) > 0 {
		ps.addf("redis.addrs", "set either redis.url or redis.addrs, not both")
	}
	if r.URL != "" {
		if _, err := redis.ParseURL(r.URL); err != nil {
			ps.addf("redis.url", "%s", redactURLError(err))
		}
		if r.DB != 0 {
			ps.addf("redis.db", "with redis.url, put the db in the URL path (redis://host:6379/%d)", r.DB)
		}
		if r.MasterName != "" {
			ps.addf("redis.masterName", "Sentinel needs redis.addrs (the Sentinels), not redis.url")
		}
	}
	if r.URL == "" && len(r.Addrs) == 0 && r.MasterName != "" {
		ps.addf("redis.masterName", "Sentinel needs redis.addrs (the Sentinels)")
	}
	seen := map[string]bool{}
	for i, a := range r.Addrs {
		p := indexPath("redis.addrs", i)
		if err := checkHostPort(a, false); err != nil {
			ps.addf(p, "%v", err)
		} else if seen[a] {
			ps.addf(p, "duplicate address %q", a)
		}
		seen[a] = true
	}
	cluster := len(r.Addrs) > 1 && r.MasterName == ""
	if cluster && r.DB != 0 {
		ps.addf("redis.db", "Redis Cluster has only db 0")
	}
	if r.DB < 0 {
		ps.addf("redis.db", "%d is negative", r.DB)
	}
	if _, err := keyspace.New(r.Prefix, max(1, min(c.Partitions, PartitionsMax))); err != nil {
		ps.addf("redis.prefix", "%q must match ^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$", r.Prefix)
	}
	if r.DialTimeout < 0 {
		ps.addf("redis.dialTimeout", "%s is negative", r.DialTimeout.D())
	}
	if r.ReadTimeout < 0 {
		ps.addf("redis.readTimeout", "%s is negative", r.ReadTimeout.D())
	}
	for _, from := range slices.Sorted(maps.Keys(r.AddressMap)) {
		p := "redis.addressMap." + from
		if err := checkHostPort(from, false); err != nil {
			ps.addf(p, "%v", err)
		}
		if err := checkHostPort(r.AddressMap[from], false); err != nil {
			ps.addf(p, "%v", err)
		}
	}
	if r.PoolSize < 0 {
		ps.addf("redis.poolSize", "%d is negative", r.PoolSize)
	} else if need := c.Runner.Concurrency + 1; r.PoolSize > 0 && !cluster && r.PoolSize < need {
		// The runner's one idle wait holds a connection in a blocking read
		// (jobs.nodeWaiter) and each running stage needs one for its
		// heartbeats: fewer starves them.
		ps.addf("redis.poolSize", "%d is less than runner.concurrency + 1 (%d); leave it out for the default", r.PoolSize, need)
	}
}

// redactURLError drops the URL from url.Parse errors: it may hold a
// password.
func redactURLError(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	return "invalid URL: " + strings.TrimPrefix(err.Error(), "redis: ")
}

// checkHostPort checks "host:port" with a numeric port; host may be empty
// (all interfaces) only if emptyHost.
func checkHostPort(s string, emptyHost bool) error {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("%q is not host:port", s)
	}
	if host == "" && !emptyHost {
		return fmt.Errorf("%q has no host", s)
	}
	if strings.ContainsAny(host, " /\x00") {
		return fmt.Errorf("%q: invalid host", s)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || (n == 0 && !emptyHost) {
		return fmt.Errorf("%q: port must be a number in 1..65535", s)
	}
	return nil
}

func (c *Config) validateRunner(ps *problemSet) {
	r := &c.Runner
	if r.ID == "" || len(r.ID) > runnerIDMax || strings.ContainsAny(r.ID, " |") || strings.ContainsFunc(r.ID, isControl) {
		ps.addf("runner.id", "%q: want 1..%d bytes without spaces, '|' or control characters", truncate(r.ID, 40), runnerIDMax)
	}
	if r.Concurrency < 1 {
		ps.addf("runner.concurrency", "%d must be at least 1", r.Concurrency)
	}
	if r.LeaseTTL < LeaseTTLMin {
		ps.addf("runner.leaseTTL", "%s is below the minimum %s", r.LeaseTTL, LeaseTTLMin)
	}
	if r.ShutdownGrace < 0 {
		ps.addf("runner.shutdownGrace", "must not be negative")
	}
	if r.ExecStarts < 0 {
		ps.addf("runner.execStarts", "%d must be at least 1 (omit it for the default)", r.ExecStarts)
	}
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f }

func (c *Config) validateHTTP(ps *problemSet) {
	if err := checkHostPort(c.HTTP.Listen, true); err != nil {
		ps.addf("http.listen", "%v", err)
	}
	if strings.ContainsFunc(c.HTTP.Token, isControl) {
		ps.addf("http.token", "must not contain control characters or newlines")
	}
	if c.HTTP.BodyLimit < 1 {
		ps.addf("http.bodyLimit", "%d must be at least 1 byte", c.HTTP.BodyLimit)
	}
	// Origins are parsed by httpapi.ParseOrigin, as the API will: a config
	// that validates is one the API serves as written.
	seen := map[string]int{}
	for i, o := range c.HTTP.AllowedOrigins {
		p := indexPath("http.allowedOrigins", i)
		n, err := httpapi.ParseOrigin(o)
		if err != nil {
			ps.addf(p, "%v", err)
		} else if first, dup := seen[n]; dup {
			ps.addf(p, "duplicate origin %q (also allowedOrigins[%d])", n, first)
		} else {
			seen[n] = i
		}
	}
	if c.HTTP.MaxEventClients < 1 {
		ps.addf("http.maxEventClients", "%d must be at least 1", c.HTTP.MaxEventClients)
	}
	if c.HTTP.MaxSubjectStreams < 1 {
		ps.addf("http.maxSubjectStreams", "%d must be at least 1", c.HTTP.MaxSubjectStreams)
	}
	if strings.ContainsFunc(c.HTTP.ReadToken, isControl) {
		ps.addf("http.readToken", "must not contain control characters or newlines")
	}
	if c.HTTP.ReadToken != "" && c.HTTP.ReadToken == c.HTTP.Token {
		ps.addf("http.readToken", "must differ from http.token (a read-only token equal to the operator's would open every route)")
	}
	c.validateSubjectTokens(ps)
}

// validateSubjectTokens checks http.subjectTokens (docs/app-access.md).
func (c *Config) validateSubjectTokens(ps *problemSet) {
	const p = "http.subjectTokens"
	st := c.HTTP.SubjectTokens
	// A key written but empty is an unset environment variable, most
	// likely: say so rather than run without subject tokens.
	for _, k := range []struct {
		key, v string
	}{{"hmacSecret", st.HMACSecret}, {"jwksURL", st.JWKSURL}, {"issuer", st.Issuer}, {"audience", st.Audience}, {"subjectClaim", st.SubjectClaim}} {
		if ps.set[p+"."+k.key] && strings.TrimSpace(k.v) == "" {
			ps.addf(p+"."+k.key, "is empty (an unset environment variable?): set it or leave the key out")
		}
	}
	if !st.Enabled() {
		if st.Issuer != "" || st.Audience != "" || (st.SubjectClaim != "" && st.SubjectClaim != apptoken.SubjectClaimDefault) {
			ps.addf(p, "issuer, audience or subjectClaim without hmacSecret or jwksURL: set one of them to accept subject tokens")
		}
		return
	}
	if st.HMACSecret != "" {
		if len(st.HMACSecret) < apptoken.HMACSecretMin {
			ps.addf(p+".hmacSecret", "is %d bytes; an HS256 secret must be at least %d (e.g. openssl rand -base64 32)", len(st.HMACSecret), apptoken.HMACSecretMin)
		}
		if st.HMACSecret == c.HTTP.Token || st.HMACSecret == c.HTTP.ReadToken {
			ps.addf(p+".hmacSecret", "must differ from http.token and http.readToken")
		}
	}
	if st.JWKSURL != "" {
		if err := checkJWKSURL(st.JWKSURL); err != nil {
			ps.addf(p+".jwksURL", "%v", err)
		}
		if st.Audience == "" {
			ps.addf(p+".audience", "required with jwksURL: without it any token of the identity provider, issued for any application, would be accepted")
		}
	}
	if st.SubjectClaim != "" {
		if err := apptoken.CheckSubjectClaim(st.SubjectClaim); err != nil {
			ps.addf(p+".subjectClaim", "%v", err)
		}
	}
}

// checkJWKSURL accepts an https URL, or http on a loopback host.
func checkJWKSURL(s string) error {
	u, err := url.Parse(s)
	if err != nil || u.Host == "" || u.User != nil {
		return fmt.Errorf("%q is not a URL such as https://idp.example.com/.well-known/jwks.json", truncate(s, 100))
	}
	switch u.Scheme {
	case "https":
		return nil
	case "http":
		h := u.Hostname()
		if h == "localhost" {
			return nil
		}
		if ip := net.ParseIP(h); ip != nil && ip.IsLoopback() {
			return nil
		}
		return errors.New("must be https (http only on a loopback host): keys fetched in clear could be replaced")
	}
	return fmt.Errorf("scheme %q: must be https", u.Scheme)
}

// sortedScopes returns the job scopes in order, for stable output.
func sortedScopes(m map[string]*Job) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// scopeReason is the reason a scope is invalid, without the value.
func scopeReason(err error) string {
	var te *taskkey.Error
	if errors.As(err, &te) {
		return te.Reason
	}
	return err.Error()
}

func validateJob(ps *problemSet, scope string, j *Job) {
	p := keyPath("jobs", scope)
	if err := taskkey.ValidateScope(scope); err != nil {
		ps.addf(p, "invalid scope name: %s (want ^[a-z][a-z0-9_]{0,63}$)", scopeReason(err))
	}
	if j == nil {
		ps.addf(p, "empty job: it needs stages")
		return
	}
	switch {
	case len(j.Stages) == 0:
		ps.addf(p+".stages", "a job needs at least one stage")
	case len(j.Stages) > 64:
		ps.addf(p+".stages", "%d stages; at most 64", len(j.Stages))
	}
	names := map[string]int{}
	for i := range j.Stages {
		sp := indexPath(p+".stages", i)
		s := &j.Stages[i]
		if first, dup := names[s.Name]; dup && s.Name != "" {
			ps.addf(sp+".name", "duplicate stage name %q (also stages[%d])", s.Name, first)
		} else {
			names[s.Name] = i
		}
		validateStage(ps, sp, s)
	}
	if _, err := jobs.ParsePolicy(j.OnConflict); err != nil {
		ps.addf(p+".onConflict", "%q is not one of join, skip, queue, replace", j.OnConflict)
	}
	if j.MinInterval < 0 {
		ps.addf(p+".minInterval", "must not be negative")
	}
	switch {
	case j.Debounce < 0 || j.Debounce.D() > jobs.DelayMax:
		ps.addf(p+".debounce", "%s: want 0 (off) up to %s", j.Debounce, jobs.DelayMax)
	case j.DebounceMax < 0 || j.DebounceMax.D() > jobs.DelayMax:
		ps.addf(p+".debounceMax", "%s: want up to %s", j.DebounceMax, jobs.DelayMax)
	case j.DebounceMax != 0 && j.DebounceMax < j.Debounce:
		ps.addf(p+".debounceMax", "%s is below debounce %s", j.DebounceMax, j.Debounce)
	}
	if j.LeaseTTL != 0 && j.LeaseTTL < LeaseTTLMin {
		ps.addf(p+".leaseTTL", "%s is below the minimum %s", j.LeaseTTL, LeaseTTLMin)
	}
	r := j.Retry
	if r.MaxAttempts < 1 {
		ps.addf(p+".retry.maxAttempts", "%d must be at least 1 (1 disables retries)", r.MaxAttempts)
	}
	if r.Backoff < 0 {
		ps.addf(p+".retry.backoff", "must not be negative")
	}
	if r.MaxBackoff < 0 {
		ps.addf(p+".retry.maxBackoff", "must not be negative")
	}
	if r.Backoff > r.MaxBackoff {
		path := p + ".retry.backoff"
		if !ps.set[path] {
			path = p + ".retry.maxBackoff"
		}
		ps.addf(path, "backoff %s is longer than maxBackoff %s", r.Backoff, r.MaxBackoff)
	}
}

func validateStage(ps *problemSet, sp string, s *Stage) {
	switch {
	case s.Name == "":
		ps.addf(sp+".name", "required")
	case checkpoints.ValidateStages([]string{s.Name}) != nil:
		ps.addf(sp+".name", "invalid stage name %q (want ^[a-z][a-z0-9_-]{0,63}$)", truncate(s.Name, 70))
	}
	hasExec, hasHTTP := s.Exec != nil, s.HTTP != nil
	switch {
	case ps.broken[sp+".exec"] || ps.broken[sp+".http"]:
		// Given but mistyped: already reported.
	case hasExec && hasHTTP:
		ps.addf(sp, "set exactly one of exec or http, not both")
	case !hasExec && !hasHTTP:
		ps.addf(sp, "set exactly one of exec or http")
	}
	if s.Timeout < 0 {
		ps.addf(sp+".timeout", "must not be negative")
	}
	if hasExec {
		switch {
		case len(s.Exec) == 0:
			ps.addf(sp+".exec", "empty command")
		case s.Exec[0] == "":
			ps.addf(sp+".exec[0]", "empty program name")
		}
		for i, a := range s.Exec {
			if strings.ContainsRune(a, 0) {
				ps.addf(indexPath(sp+".exec", i), "contains a NUL byte")
			}
		}
		if strings.ContainsRune(s.Dir, 0) {
			ps.addf(sp+".dir", "contains a NUL byte")
		}
		for _, k := range sortedKeys(s.Env) {
			kp := keyPath(sp+".env", k)
			switch {
			case !validEnvName(k):
				ps.addf(kp, "invalid variable name (want letters, digits and _, not starting with a digit)")
			case strings.HasPrefix(k, "TASKLEASE_"):
				ps.addf(kp, "TASKLEASE_* variables are set by the runner for every run")
			}
			if strings.ContainsRune(s.Env[k], 0) {
				ps.addf(kp, "value contains a NUL byte")
			}
		}
		if s.KillGrace < 0 {
			ps.addf(sp+".killGrace", "must not be negative")
		}
	} else {
		if s.Dir != "" {
			ps.addf(sp+".dir", "only exec stages have a working directory")
		}
		if s.Env != nil {
			ps.addf(sp+".env", "only exec stages have an environment")
		}
		if s.KillGrace != 0 {
			ps.addf(sp+".killGrace", "only exec stages are killed; use timeout")
		}
	}
	if hasHTTP {
		validateHTTPStage(ps, sp+".http", s.HTTP)
	}
}

func validateHTTPStage(ps *problemSet, hp string, h *HTTPStage) {
	if h.URL == "" {
		ps.addf(hp+".url", "required")
	} else if u, err := url.Parse(h.URL); err != nil {
		ps.addf(hp+".url", "%s", redactURLError(err))
	} else if u.Scheme != "http" && u.Scheme != "https" {
		ps.addf(hp+".url", "scheme must be http or https")
	} else if u.Host == "" {
		ps.addf(hp+".url", "no host")
	}
	for _, k := range sortedKeys(h.Headers) {
		kp := keyPath(hp+".headers", k)
		switch {
		case !validHeaderName(k):
			ps.addf(kp, "invalid header name")
		case strings.EqualFold(k, "Content-Type") || strings.EqualFold(k, jobs.HTTPFencingTokenHeader):
			ps.addf(kp, "set by the stage on every request")
		}
		if strings.ContainsFunc(h.Headers[k], func(r rune) bool { return r != '\t' && isControl(r) }) {
			ps.addf(kp, "value must not contain control characters or newlines")
		}
	}
	if h.Timeout < 0 {
		ps.addf(hp+".timeout", "must not be negative")
	}
}

// validHeaderName checks an RFC 9110 token.
func validHeaderName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0 {
			continue
		}
		return false
	}
	return true
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// demoScopes are the scopes of DemoJobs, valid in schedules when no jobs
// are configured.
var demoScopes = []string{"backup", "course_sync", "message_sync"}

func (c *Config) validateSchedules(ps *problemSet) {
	names := map[string]int{}
	for i := range c.Schedules {
		s := &c.Schedules[i]
		p := indexPath("schedules", i)
		switch {
		case s.Name == "":
			ps.addf(p+".name", "required")
		case !scheduleNameRE().MatchString(s.Name):
			ps.addf(p+".name", "invalid schedule name %q (want ^[a-z0-9][a-z0-9_.-]{0,63}$)", truncate(s.Name, 70))
		default:
			if first, dup := names[s.Name]; dup {
				ps.addf(p+".name", "duplicate schedule name %q (also schedules[%d])", s.Name, first)
			} else {
				names[s.Name] = i
			}
		}
		if s.Cron == "" {
			ps.addf(p+".cron", "required: five fields (\"*/15 * * * *\") or a descriptor (\"@every 30s\", \"@hourly\")")
		} else if _, err := ParseCron(s.Cron); err != nil {
			ps.addf(p+".cron", "%s", err)
		}
		switch {
		case s.Scope == "":
			ps.addf(p+".scope", "required")
		case taskkey.ValidateScope(s.Scope) != nil:
			ps.addf(p+".scope", "invalid scope name: %s", scopeReason(taskkey.ValidateScope(s.Scope)))
		case len(c.Jobs) == 0 && !slices.Contains(demoScopes, s.Scope):
			ps.addf(p+".scope", "%q is not a job; with no jobs configured only the demo scopes %s exist", s.Scope, strings.Join(demoScopes, ", "))
		case len(c.Jobs) > 0 && !hasJob(c.Jobs, s.Scope):
			ps.addf(p+".scope", "%q is not a configured job (jobs: %s)", s.Scope, strings.Join(sortedScopes(c.Jobs), ", "))
		}
		if s.Subjects.IsZero() {
			ps.addf(p+".subjects", `required: "all" or a list of subjects`)
		}
		seen := map[string]int{}
		for k, subj := range s.Subjects.List {
			sp := indexPath(p+".subjects", k)
			if err := taskkey.ValidateSubject(subj); err != nil {
				var te *taskkey.Error
				reason := err.Error()
				if errors.As(err, &te) {
					reason = te.Reason
				}
				ps.addf(sp, "invalid subject %q: %s", truncate(subj, 70), reason)
			} else if first, dup := seen[subj]; dup {
				ps.addf(sp, "duplicate subject %q (also subjects[%d])", subj, first)
			} else {
				seen[subj] = k
			}
		}
	}
}

func hasJob(m map[string]*Job, scope string) bool {
	_, ok := m[scope]
	return ok
}
