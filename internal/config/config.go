// Package config loads, checks and applies tasklease's YAML configuration
// (docs/configuration.md; config.example.yaml is the documented reference).
//
// Loading is strict: unknown keys, wrong types and invalid values are all
// reported at once, each with its path ("jobs.course_sync.stages[1].exec"),
// so a deployment fails at start with the whole list instead of one error
// per restart. ${NAME} and ${NAME:-default} are expanded in the raw text
// before parsing.
package config

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/tasklease/tasklease/internal/apptoken"
	"github.com/tasklease/tasklease/internal/httpapi"
	"github.com/tasklease/tasklease/internal/keyspace"
	"github.com/tasklease/tasklease/jobs"
)

// Defaults of the configuration.
const (
	PartitionsDefault = keyspace.PartitionsDefault // 16
	PartitionsMax     = keyspace.PartitionsMax     // 1024
	PrefixDefault     = keyspace.PrefixDefault     // "tasklease"
	ListenDefault     = "127.0.0.1:8080"
	BodyLimitDefault  = 1 << 20 // 1 MiB
	LogLevelDefault   = "info"
	LogFormatDefault  = "text"
	HistoryCapDefault = 200
	RetentionDefault  = Duration(jobs.RetentionDefault) // 168h
	// LeaseTTLMin is the smallest lease TTL accepted: the lease is renewed
	// every TTL/3, and shorter periods turn Redis latency into lease loss.
	LeaseTTLMin = Duration(100 * time.Millisecond)
	// MaxEventClientsDefault bounds concurrent GET /v1/events streams (100).
	MaxEventClientsDefault = httpapi.MaxEventClientsDefault
	// MaxSubjectStreamsDefault bounds concurrent subject streams (10,000).
	MaxSubjectStreamsDefault = httpapi.MaxSubjectStreamsDefault
	// maxConfigSize bounds what Parse reads; real configs are a few KiB.
	maxConfigSize = 4 << 20
)

// Config is the whole configuration of a runner process.
type Config struct {
	// Redis to connect to; no url and no addrs means an embedded in-process
	// Redis (miniredis), for trying tasklease on a fresh machine.
	Redis Redis `yaml:"redis"`
	// Partitions of the keyspace (default 16, 1..1024). Fixed for a
	// deployment's life: changing it moves keys to other partitions.
	Partitions int `yaml:"partitions"`
	// Runner settings.
	Runner Runner `yaml:"runner"`
	// HTTP API and dashboard.
	HTTP HTTP `yaml:"http"`
	// Log output.
	Log Log `yaml:"log"`
	// Tracing (OpenTelemetry), off by default.
	Tracing Tracing `yaml:"tracing"`
	// Retention of finished runs and their history (default 168h).
	Retention Duration `yaml:"retention"`
	// HistoryCap bounds each task's history (default 200 events).
	HistoryCap int `yaml:"historyCap"`
	// Limiters by name: fleet-wide limits that jobs share by naming them
	// (Job.Limiters), e.g. the calls a remote store accepts.
	Limiters map[string]*Limiter `yaml:"limiters"`
	// Jobs by scope. None configured means the demo jobs (DemoJobs).
	Jobs map[string]*Job `yaml:"jobs"`
	// Schedules submit runs from cron expressions.
	Schedules []Schedule `yaml:"schedules"`
}

// Redis says where Redis is: a URL for a single node, or addrs for Redis
// Cluster (several addresses) or Sentinel (with masterName).
type Redis struct {
	// URL of a single node: redis://[user:pass@]host:port/db, rediss:// for
	// TLS, unix:///path. Query options as in go-redis ParseURL.
	URL string `yaml:"url"`
	// Addrs of Cluster nodes, or of Sentinels when MasterName is set. One
	// address without MasterName is a single node.
	Addrs []string `yaml:"addrs"`
	// MasterName selects Sentinel: the name of the monitored master.
	MasterName string `yaml:"masterName"`
	// Username for Redis ACLs; overrides the URL's.
	Username string `yaml:"username"`
	// Password; overrides the URL's, so a secret can come from ${ENV}.
	Password string `yaml:"password"`
	// DB number with addrs (single node or Sentinel). With url, put the db
	// in the URL path.
	DB int `yaml:"db"`
	// Prefix of every key (default "tasklease").
	Prefix string `yaml:"prefix"`
	// PoolSize of the connection pool per node (default max(10 ×
	// GOMAXPROCS, concurrency + partitions + 16)): every partition holds a
	// connection in a blocking wait on its bell.
	PoolSize int `yaml:"poolSize"`
	// DialTimeout and ReadTimeout of every connection (default: go-redis's
	// 5s for both; writes use ReadTimeout). They bound how long a call to a
	// master that hangs (not dies) waits before it counts as failed, and so
	// how soon a Cluster or Sentinel failover is followed: docs/operations.md.
	// Blocking waits on a partition's bell add their block time.
	DialTimeout Duration `yaml:"dialTimeout"`
	ReadTimeout Duration `yaml:"readTimeout"`
	// AddressMap dials the value wherever Redis names the key: a node's
	// address as url, addrs, a Sentinel (the primary it reports) or a
	// Cluster (CLUSTER SLOTS, redirections) give it, when that address is
	// not reachable as it stands (NAT, a port-forward, a proxy in front
	// of each node). Both sides are host:port; addresses not in the map
	// are dialled as given.
	AddressMap map[string]string `yaml:"addressMap"`
}

// Runner configures the runner loop.
type Runner struct {
	// ID names the runner in lease owners, e.g. the pod name (default: the
	// hostname).
	ID string `yaml:"id"`
	// Concurrency bounds the runs executing at once (default 16).
	Concurrency int `yaml:"concurrency"`
	// LeaseTTL of runs whose job sets none (default 15s, at least 100ms).
	LeaseTTL Duration `yaml:"leaseTTL"`
	// ShutdownGrace is how long running stages may finish on SIGTERM before
	// they are handed back (default 10s).
	ShutdownGrace Duration `yaml:"shutdownGrace"`
	// ExecStarts bounds the exec stage processes being started at once
	// (default 2 × the CPUs Go may use); see jobs.RunnerConfig.ExecStarts.
	ExecStarts int `yaml:"execStarts"`
}

// HTTP configures the API server.
type HTTP struct {
	// Listen address, host:port (default 127.0.0.1:8080).
	Listen string `yaml:"listen"`
	// Token, when set, is required as "Authorization: Bearer <token>" on
	// every /v1 route.
	Token string `yaml:"token"`
	// BodyLimit bounds request bodies in bytes (default 1 MiB).
	BodyLimit int64 `yaml:"bodyLimit"`
	// AllowedOrigins are the browser origins, scheme://host[:port] without
	// path and without wildcards, whose pages may call the /v1 routes
	// cross-origin (CORS). Requests from any other site are answered 403.
	// Their hosts, like the listen host, are also served without a token.
	AllowedOrigins []string `yaml:"allowedOrigins"`
	// MaxEventClients bounds the concurrent GET /v1/events streams
	// (default 100); one more is answered 503.
	MaxEventClients int `yaml:"maxEventClients"`
	// ReadToken, when set, is a read-only operator token: the GET routes
	// (the console without its actions); POSTs are answered 403.
	ReadToken string `yaml:"readToken"`
	// SubjectTokens let end users' apps call the API for their own subject
	// with a JWT (docs/app-access.md).
	SubjectTokens SubjectTokens `yaml:"subjectTokens"`
	// MaxSubjectStreams bounds the concurrent
	// GET /v1/subjects/{subject}/events streams (default 10,000), apart
	// from maxEventClients; one more is answered 503.
	MaxSubjectStreams int `yaml:"maxSubjectStreams"`
}

// SubjectTokens configures the verification of subject tokens: JWTs that
// name one subject and open only its tasks (DESIGN §12). Set HMACSecret,
// JWKSURL or both.
type SubjectTokens struct {
	// HMACSecret verifies HS256 tokens minted by the app's backend (or by
	// runner token); at least 32 bytes.
	HMACSecret string `yaml:"hmacSecret"`
	// JWKSURL is an identity provider's JSON Web Key Set (https; http only
	// on a loopback host); its keys verify RS*, PS*, ES* and EdDSA tokens,
	// each with its own alg. Requires audience.
	JWKSURL string `yaml:"jwksURL"`
	// Issuer and Audience, when set, must equal the tokens' iss and aud.
	Issuer   string `yaml:"issuer"`
	Audience string `yaml:"audience"`
	// SubjectClaim names the claim holding the subject (default sub).
	SubjectClaim string `yaml:"subjectClaim"`
}

// Enabled reports whether subject tokens are accepted.
func (s SubjectTokens) Enabled() bool { return s.HMACSecret != "" || s.JWKSURL != "" }

// Verifier returns the apptoken configuration of s.
func (s SubjectTokens) Verifier() apptoken.Config {
	return apptoken.Config{HMACSecret: s.HMACSecret, JWKSURL: s.JWKSURL, Issuer: s.Issuer, Audience: s.Audience, SubjectClaim: s.SubjectClaim}
}

// Log configures log/slog output.
type Log struct {
	// Level: debug, info, warn or error (default info).
	Level string `yaml:"level"`
	// Format: text or json (default text).
	Format string `yaml:"format"`
}

// Tracing configures OpenTelemetry tracing: spans for submits, runs
// (linked to their requests), stages and the HTTP API, exported with OTLP
// over HTTP to the endpoint of the standard OTEL_EXPORTER_OTLP_* variables
// (default http://localhost:4318), or with OTEL_TRACES_EXPORTER=console
// written to standard output as JSON, one span per line (no collector
// needed: for trying it out).
type Tracing struct {
	// Enabled turns tracing on. It is also on when OTEL_TRACES_EXPORTER is
	// otlp or console or an OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT is set,
	// and off when OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none.
	Enabled bool `yaml:"enabled"`
	// ServiceName is the service.name of the spans (default tasklease;
	// OTEL_SERVICE_NAME wins).
	ServiceName string `yaml:"serviceName"`
}

// TracingOn decides whether tracing is on, from the config and the
// standard OpenTelemetry variables read through getenv.
func (c *Config) TracingOn(getenv func(string) string) bool {
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") || getenv("OTEL_TRACES_EXPORTER") == "none" {
		return false
	}
	exp := getenv("OTEL_TRACES_EXPORTER")
	return c.Tracing.Enabled || exp == "otlp" || exp == "console" ||
		getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Job configures one scope.
type Job struct {
	// Stages run in order (1..64, distinct names).
	Stages []Stage `yaml:"stages"`
	// OnConflict: join (default), skip, queue or replace.
	OnConflict string `yaml:"onConflict"`
	// MinInterval throttles schedule and foreground requests after a
	// success (default 0: never).
	MinInterval Duration `yaml:"minInterval"`
	// Debounce delays the runs that schedule and foreground requests start
	// by this, and each later such request moves the start to now +
	// debounce, never past the first request + debounceMax (default 1m).
	// Default 0: off.
	Debounce    Duration `yaml:"debounce"`
	DebounceMax Duration `yaml:"debounceMax"`
	// Retry of failed attempts.
	Retry Retry `yaml:"retry"`
	// LeaseTTL overrides runner.leaseTTL for this job.
	LeaseTTL Duration `yaml:"leaseTTL"`
	// Foreground: the foreground hook submits this job when it names no
	// scopes.
	Foreground bool `yaml:"foreground"`
	// Limiters names the limiters (Config.Limiters) a run of this job
	// holds a slot of while it executes.
	Limiters []string `yaml:"limiters"`
	// Concurrency caps this job's runs executing at once across the whole
	// fleet (not per runner: that is runner.concurrency). Default 0: no cap.
	Concurrency int `yaml:"concurrency"`
	// Rate paces the starts of this job's runs fleet-wide: "N/s", "N/m" or
	// "N/h", with up to Burst starts at once (default 1). Default: none.
	Rate  string `yaml:"rate"`
	Burst int    `yaml:"burst"`
	// Fairness groups the job's runs while they wait for a limiter, so the
	// groups take turns. Default: one group, oldest first.
	Fairness *Fairness `yaml:"fairness"`
}

// Limiter is a named, fleet-wide limit on the runs of the jobs that list
// it: a concurrency, a rate, or both.
type Limiter struct {
	// Concurrency: at most this many runs holding the limiter execute at
	// once across every runner (0: no cap).
	Concurrency int `yaml:"concurrency"`
	// Rate paces the starts of runs using the limiter: "N/s", "N/m" or
	// "N/h", with up to Burst starts at once (default 1).
	Rate  string `yaml:"rate"`
	Burst int    `yaml:"burst"`
	// HoldOnRetryAfter: when a run using the limiter is told to retry after
	// a while (jobs.RetryAfter, HTTP 429 or 503 with Retry-After), the
	// limiter starts nothing until then.
	HoldOnRetryAfter bool `yaml:"holdOnRetryAfter"`
}

// Fairness groups a job's runs for fair share while they wait for a
// limiter.
type Fairness struct {
	// GroupBy: subjectPrefix (the subject up to Separator) or request (the
	// group named by the request that created the run).
	GroupBy string `yaml:"groupBy"`
	// Separator ends a subject's prefix (subjectPrefix only; default ":").
	Separator string `yaml:"separator"`
}

// Retry spaces and bounds attempts.
type Retry struct {
	// MaxAttempts counts every attempt including the first (default 3; 1
	// disables retries).
	MaxAttempts int `yaml:"maxAttempts"`
	// Backoff before the second attempt, doubled after each (default 1s).
	Backoff Duration `yaml:"backoff"`
	// MaxBackoff caps the delay (default 5m).
	MaxBackoff Duration `yaml:"maxBackoff"`
}

// Stage is one named step: exactly one of Exec or HTTP.
type Stage struct {
	// Name, ^[a-z][a-z0-9_-]{0,63}$, distinct within the job.
	Name string `yaml:"name"`
	// Exec is the argv of a command run per execution.
	Exec []string `yaml:"exec"`
	// Dir is the command's working directory (exec only).
	Dir string `yaml:"dir"`
	// Env adds variables to the command's environment (exec only).
	Env map[string]string `yaml:"env"`
	// HTTP POSTs the run to a URL instead.
	HTTP *HTTPStage `yaml:"http"`
	// Timeout bounds one execution (default 0: none).
	Timeout Duration `yaml:"timeout"`
	// KillGrace is the delay between SIGTERM and SIGKILL (exec only; default
	// 5s, capped by the lease).
	KillGrace Duration `yaml:"killGrace"`
}

// HTTPStage configures an HTTP stage.
type HTTPStage struct {
	// URL, http or https.
	URL string `yaml:"url"`
	// Headers added to the request, e.g. Authorization.
	Headers map[string]string `yaml:"headers"`
	// Timeout of the request (default 30s).
	Timeout Duration `yaml:"timeout"`
}

// Schedule submits runs of a scope for some subjects on a cron schedule.
type Schedule struct {
	// Name, ^[a-z0-9][a-z0-9_.-]{0,63}$, unique; part of the idempotency key
	// of each occurrence.
	Name string `yaml:"name"`
	// Cron: five fields or a descriptor (@every 30s, @hourly).
	Cron string `yaml:"cron"`
	// Scope of a configured job.
	Scope string `yaml:"scope"`
	// Subjects to submit for.
	Subjects Subjects `yaml:"subjects"`
}

// Default returns a config with every default applied and no jobs: an
// embedded Redis and the demo jobs, what `runner serve` runs with no file.
func Default() *Config {
	c := &Config{}
	c.applyDefaults()
	return c
}

// Load reads the file at path and returns its config, defaults applied and
// validated. Invalid content yields Problems (errors.Is ErrInvalid); an
// unreadable file yields the read error.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return Parse(data)
}

// Parse is Load from bytes: expand ${ENV}, parse, apply defaults, validate.
func Parse(data []byte) (*Config, error) {
	ps := newProblemSet()
	if len(data) > maxConfigSize {
		ps.add("", 0, "config is %d bytes, more than the %d accepted", len(data), maxConfigSize)
		return nil, ps.result()
	}
	text := expandEnv(string(data), os.LookupEnv)
	c := &Config{}
	decodeYAML(text, c, ps)
	c.checkExplicitZeros(ps)
	c.applyDefaults()
	c.validate(ps)
	if err := ps.result(); err != nil {
		return nil, err
	}
	return c, nil
}

// Validate applies defaults to unset (zero) fields and reports every
// problem. Parse calls it; call it again after changing a config in Go,
// e.g. from command-line flags.
func (c *Config) Validate() error {
	ps := newProblemSet()
	c.applyDefaults()
	c.validate(ps)
	return ps.result()
}

// Embedded reports whether no Redis is configured, so the runner starts an
// in-process one.
func (c *Config) Embedded() bool {
	return c.Redis.URL == "" && len(c.Redis.Addrs) == 0
}

// applyDefaults fills zero fields. Jobs get theirs too, so that what
// validate checks (backoff ≤ maxBackoff) is what will run.
func (c *Config) applyDefaults() {
	if c.Redis.Prefix == "" {
		c.Redis.Prefix = PrefixDefault
	}
	if c.Partitions == 0 {
		c.Partitions = PartitionsDefault
	}
	if c.Runner.ID == "" {
		c.Runner.ID = defaultRunnerID()
	}
	if c.Runner.Concurrency == 0 {
		c.Runner.Concurrency = jobs.ConcurrencyDefault
	}
	if c.Runner.LeaseTTL == 0 {
		c.Runner.LeaseTTL = Duration(jobs.LeaseTTLDefault)
	}
	if c.Runner.ShutdownGrace == 0 {
		c.Runner.ShutdownGrace = Duration(jobs.ShutdownGraceDefault)
	}
	if c.HTTP.Listen == "" {
		c.HTTP.Listen = ListenDefault
	}
	if c.HTTP.BodyLimit == 0 {
		c.HTTP.BodyLimit = BodyLimitDefault
	}
	if c.HTTP.MaxEventClients == 0 {
		c.HTTP.MaxEventClients = MaxEventClientsDefault
	}
	if c.HTTP.MaxSubjectStreams == 0 {
		c.HTTP.MaxSubjectStreams = MaxSubjectStreamsDefault
	}
	if c.HTTP.SubjectTokens.Enabled() && c.HTTP.SubjectTokens.SubjectClaim == "" {
		c.HTTP.SubjectTokens.SubjectClaim = apptoken.SubjectClaimDefault
	}
	if c.Log.Level == "" {
		c.Log.Level = LogLevelDefault
	}
	if c.Log.Format == "" {
		c.Log.Format = LogFormatDefault
	}
	if c.Retention == 0 {
		c.Retention = RetentionDefault
	}
	if c.HistoryCap == 0 {
		c.HistoryCap = HistoryCapDefault
	}
	for _, j := range c.Jobs {
		if j == nil {
			continue
		}
		if j.OnConflict == "" {
			j.OnConflict = string(jobs.PolicyJoin)
		}
		if j.Retry.MaxAttempts == 0 {
			j.Retry.MaxAttempts = jobs.MaxAttemptsDefault
		}
		if j.Retry.Backoff == 0 {
			j.Retry.Backoff = Duration(jobs.BackoffDefault)
		}
		if j.Retry.MaxBackoff == 0 {
			j.Retry.MaxBackoff = Duration(jobs.MaxBackoffDefault)
		}
	}
}

// defaultRunnerID is the hostname, made valid: a runner must start even on
// a host with an odd name.
func defaultRunnerID() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		return "runner"
	}
	h = strings.Map(func(r rune) rune {
		if r == ' ' || r == '|' || r < 0x20 || r == 0x7f {
			return '-'
		}
		return r
	}, h)
	if len(h) > runnerIDMax {
		h = h[:runnerIDMax]
	}
	return strings.ToValidUTF8(h, "-")
}
