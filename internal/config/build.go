package config

import (
	"cmp"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"runtime"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/jobs"
)

// poolSizeSlack is added to concurrency + partitions for the default pool:
// the retry mover, reclaimer, cron leader, pub/sub and API share it. (On a
// single Redis the partitions' idle fetchers share one wait, so the pool
// is larger than they need; on a Cluster each partition still waits on
// its own connection. A pool only opens the connections it uses.)
const poolSizeSlack = 16

// RedisOptions returns go-redis options for the configured Redis: a single
// node from url (redis://, rediss:// with TLS, unix://), Cluster from
// several addrs, Sentinel from addrs with masterName. Username and password
// override the URL's. For an embedded config (Embedded) Addrs is empty and
// the caller fills in the in-process server's address. Call it on a
// validated config: an invalid url yields options without an address.
func (c *Config) RedisOptions() *redis.UniversalOptions {
	r := c.Redis
	o := &redis.UniversalOptions{}
	if r.URL != "" {
		if u, err := redis.ParseURL(r.URL); err == nil {
			o = universalFromOptions(u)
		}
	} else {
		o.Addrs = slices.Clone(r.Addrs)
		o.MasterName = r.MasterName
		o.DB = r.DB
	}
	if r.Username != "" {
		o.Username = r.Username
	}
	if r.Password != "" {
		o.Password = r.Password
	}
	if r.DialTimeout > 0 {
		o.DialTimeout = r.DialTimeout.D()
	}
	if r.ReadTimeout > 0 {
		o.ReadTimeout, o.WriteTimeout = r.ReadTimeout.D(), r.ReadTimeout.D()
	}
	switch {
	case r.PoolSize > 0:
		o.PoolSize = r.PoolSize
	case o.PoolSize == 0: // not set by a pool_size URL option either
		conc, parts := c.Runner.Concurrency, c.Partitions
		if conc <= 0 {
			conc = jobs.ConcurrencyDefault
		}
		if parts <= 0 {
			parts = PartitionsDefault
		}
		o.PoolSize = max(10*runtime.GOMAXPROCS(0), conc+parts+poolSizeSlack)
	}
	if len(r.AddressMap) > 0 {
		o.Dialer = mappedDialer(maps.Clone(r.AddressMap), o.DialTimeout, o.TLSConfig)
	}
	if o.ConnMaxIdleTime == 0 { // not set by a conn_max_idle_time URL option
		// Taken oldest first, the pool's connections are each used in
		// turn, and one idle for poolIdleTimeout is closed when it comes
		// up: a busy pod keeps what it uses, and an idle one closes what
		// its start opened (go-redis keeps idle connections for 30 minutes
		// and, newest first, never looks at the oldest).
		o.PoolFIFO, o.ConnMaxIdleTime = true, jobs.PoolIdleTimeout
	}
	return o
}

// mappedDialer dials to[addr] in place of addr where the map names it.
// go-redis uses it for every connection of the client: data nodes,
// Sentinels, and the Cluster nodes it learns of. Like go-redis's own
// dialer it applies the timeout and, for rediss://, TLS (with the
// original host as the server name), which a custom Dialer must do itself.
func mappedDialer(to map[string]string, timeout time.Duration, tlsConf *tls.Config) func(ctx context.Context, network, addr string) (net.Conn, error) {
	nd := &net.Dialer{Timeout: cmp.Or(timeout, dialTimeoutDefault), KeepAlive: 5 * time.Minute}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		target := addr
		if a, ok := to[addr]; ok {
			target = a
		}
		if tlsConf == nil {
			return nd.DialContext(ctx, network, target)
		}
		conf := tlsConf.Clone()
		if conf.ServerName == "" {
			conf.ServerName, _, _ = net.SplitHostPort(addr)
		}
		return (&tls.Dialer{NetDialer: nd, Config: conf}).DialContext(ctx, network, target)
	}
}

// dialTimeoutDefault is go-redis's DialTimeout, which a Dialer of ours
// must apply itself.
const dialTimeoutDefault = 5 * time.Second

// universalFromOptions carries over what redis.ParseURL can set (address,
// credentials, db, TLS and the query options).
func universalFromOptions(u *redis.Options) *redis.UniversalOptions {
	return &redis.UniversalOptions{
		Addrs:                   []string{u.Addr},
		ClientName:              u.ClientName,
		DB:                      u.DB,
		Protocol:                u.Protocol,
		Username:                u.Username,
		Password:                u.Password,
		MaxRetries:              u.MaxRetries,
		MinRetryBackoff:         u.MinRetryBackoff,
		MaxRetryBackoff:         u.MaxRetryBackoff,
		DialTimeout:             u.DialTimeout,
		ReadTimeout:             u.ReadTimeout,
		WriteTimeout:            u.WriteTimeout,
		PoolFIFO:                u.PoolFIFO,
		PoolSize:                u.PoolSize,
		PoolTimeout:             u.PoolTimeout,
		MinIdleConns:            u.MinIdleConns,
		MaxIdleConns:            u.MaxIdleConns,
		MaxActiveConns:          u.MaxActiveConns,
		MaxConcurrentDials:      u.MaxConcurrentDials,
		PipelinePoolSize:        u.PipelinePoolSize,
		PipelineReadBufferSize:  u.PipelineReadBufferSize,
		PipelineWriteBufferSize: u.PipelineWriteBufferSize,
		ConnMaxIdleTime:         u.ConnMaxIdleTime,
		ConnMaxLifetime:         u.ConnMaxLifetime,
		ConnMaxLifetimeJitter:   u.ConnMaxLifetimeJitter,
		TLSConfig:               u.TLSConfig,
	}
}

// stageHandler is a configured stage kind: both check themselves.
type stageHandler interface {
	jobs.Handler
	Validate() error
}

// BuildJobs turns the configured jobs into jobs.Jobs, sorted by scope,
// with their limiters, limits and fairness (the limiters themselves are in
// RegistryConfig): exec stages become *jobs.ExecStage (env as sorted
// "K=V"), http stages *jobs.HTTPStage (with an http.Client only when a
// timeout is set, so the others share the default client's connections). With no jobs configured
// it returns DemoJobs, as `runner serve` does. Errors wrap ErrInvalid; they
// cannot happen for a config from Parse or Load.
func (c *Config) BuildJobs() ([]jobs.Job, error) {
	if len(c.Jobs) == 0 {
		return DemoJobs(), nil
	}
	out := make([]jobs.Job, 0, len(c.Jobs))
	for _, scope := range sortedScopes(c.Jobs) {
		j := c.Jobs[scope]
		if j == nil {
			return nil, fmt.Errorf("%w: %s: empty job", ErrInvalid, keyPath("jobs", scope))
		}
		job := jobs.Job{
			Scope:       scope,
			OnConflict:  jobs.Policy(j.OnConflict),
			MinInterval: j.MinInterval.D(),
			Debounce:    j.Debounce.D(),
			DebounceMax: j.DebounceMax.D(),
			Retry: jobs.RetryPolicy{
				MaxAttempts: j.Retry.MaxAttempts,
				Backoff:     j.Retry.Backoff.D(),
				MaxBackoff:  j.Retry.MaxBackoff.D(),
			},
			LeaseTTL:   j.LeaseTTL.D(),
			Foreground: j.Foreground,
			Stages:     make([]jobs.Stage, 0, len(j.Stages)),
		}
		buildJobLimits(&job, j)
		for i, s := range j.Stages {
			h, err := buildHandler(s)
			if err == nil {
				err = h.Validate()
			}
			if err != nil {
				return nil, fmt.Errorf("%w: %s: %w", ErrInvalid, indexPath(keyPath("jobs", scope)+".stages", i), err)
			}
			job.Stages = append(job.Stages, jobs.Stage{Name: s.Name, Timeout: s.Timeout.D(), Handler: h})
		}
		out = append(out, job)
	}
	return out, nil
}

func buildHandler(s Stage) (stageHandler, error) {
	switch {
	case s.Exec != nil && s.HTTP == nil:
		env := make([]string, 0, len(s.Env))
		for _, k := range sortedKeys(s.Env) {
			env = append(env, k+"="+s.Env[k])
		}
		return &jobs.ExecStage{
			Command:    slices.Clone(s.Exec),
			Dir:        s.Dir,
			Env:        env,
			KillGrace:  s.KillGrace.D(),
			Supervisor: execSupervisor(),
		}, nil
	case s.HTTP != nil && s.Exec == nil:
		h := &jobs.HTTPStage{URL: s.HTTP.URL, Header: maps.Clone(s.HTTP.Headers)}
		if s.HTTP.Timeout > 0 {
			h.Client = &http.Client{Timeout: s.HTTP.Timeout.D()}
		}
		return h, nil
	}
	return nil, fmt.Errorf("set exactly one of exec or http")
}

// execSupervisor is the supervisor prefix for exec stages: on Linux this
// binary, whose main hosts jobs.SuperviseMain (cmd/runner's does, and so
// does its tests' TestMain). /proc/self/exe, not the executable's path: a
// binary replaced on disk during a deploy must not supply the supervisor of
// a runner still running the old one. A binary that runs these stages
// without hosting the supervisor would run its own main with the
// supervisor's arguments — a test binary would run all its tests again.
func execSupervisor() []string {
	if runtime.GOOS != "linux" {
		return nil
	}
	if _, err := os.Stat("/proc/self/exe"); err != nil {
		return nil // no /proc: the stages run unsupervised
	}
	return []string{"/proc/self/exe", jobs.SuperviseCommand}
}

// RegistryConfig returns the registry settings of the config, the
// limiters included (by name). Jobs, Logger and Metrics are the caller's
// to fill.
func (c *Config) RegistryConfig() jobs.Config {
	return jobs.Config{
		Prefix:     c.Redis.Prefix,
		Partitions: c.Partitions,
		HistoryCap: c.HistoryCap,
		Retention:  c.Retention.D(),
		Limiters:   c.buildLimiters(),
	}
}

// RunnerConfig returns the runner settings of the config; fields it does
// not set keep the jobs package defaults.
func (c *Config) RunnerConfig() jobs.RunnerConfig {
	return jobs.RunnerConfig{
		ID:            c.Runner.ID,
		Concurrency:   c.Runner.Concurrency,
		LeaseTTL:      c.Runner.LeaseTTL.D(),
		ShutdownGrace: c.Runner.ShutdownGrace.D(),
		ExecStarts:    c.Runner.ExecStarts,
	}
}

// SlogLevel returns the configured level (info if unknown).
func (l Log) SlogLevel() slog.Level {
	switch l.Level {
	case "debug":
		return slog.LevelDebug
	case "warn":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	}
	return slog.LevelInfo
}

// NewLogger returns a logger writing to w in the configured level and
// format (text unless json).
func (l Log) NewLogger(w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: l.SlogLevel()}
	if l.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// compile-time checks that the stage kinds still fit.
var (
	_ stageHandler = (*jobs.ExecStage)(nil)
	_ stageHandler = (*jobs.HTTPStage)(nil)
)
