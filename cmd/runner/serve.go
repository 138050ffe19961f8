package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"

	"github.com/tasklease/tasklease/internal/apptoken"
	"github.com/tasklease/tasklease/internal/config"
	"github.com/tasklease/tasklease/internal/httpapi"
	"github.com/tasklease/tasklease/internal/tracing"
	"github.com/tasklease/tasklease/jobs"
	"github.com/tasklease/tasklease/triggers"
)

// redisWaitDefault is how long serve waits for Redis at start before
// exiting 3: long enough for a compose stack to come up.
const redisWaitDefault = 10 * time.Second

// redisWait is redisWaitDefault; tests shorten it.
var redisWait = redisWaitDefault

func cmdServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "config file (YAML); default: embedded Redis and the demo jobs")
	listen := fs.String("listen", "", "HTTP listen address (overrides http.listen)")
	redisURL := fs.String("redis", "", "Redis URL (overrides redis.url/addrs)")
	historyLog := fs.String("history-log", "", "append what this runner saw of its runs' grants, advances and finishes to this file, one JSON line each (for fault tests: docs/correctness.md#histories)")
	if pos, err := parseArgs(fs, args); err != nil {
		return err
	} else if len(pos) > 0 {
		return fail(exitUsage, "serve takes no arguments, got %q", pos)
	}

	cfg := config.Default()
	if *cfgPath != "" {
		var err error
		if cfg, err = config.Load(*cfgPath); err != nil {
			return fail(exitUsage, "%w", err)
		}
	}
	if *listen != "" {
		cfg.HTTP.Listen = *listen
	}
	if *redisURL != "" {
		if _, err := redis.ParseURL(*redisURL); err != nil {
			return fail(exitUsage, "--redis: %w", err)
		}
		cfg.Redis.URL, cfg.Redis.Addrs = *redisURL, nil
	}
	if err := cfg.Validate(); err != nil {
		return fail(exitUsage, "%w", err)
	}
	log := cfg.Log.NewLogger(stderr)
	var history io.Writer
	if *historyLog != "" {
		f, err := os.OpenFile(*historyLog, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err != nil {
			return fail(exitUsage, "--history-log: %w", err)
		}
		defer f.Close()
		history = f // unbuffered: a killed runner's last lines are on disk
	}
	return serve(ctx, cfg, log, stdout, history, nil)
}

// serve runs everything a runner pod runs until ctx ends. spans receives
// the console trace exporter's output (OTEL_TRACES_EXPORTER=console);
// history, when not nil, the runner's history log (--history-log). ready,
// when not nil, receives the HTTP address once it listens (for tests).
func serve(ctx context.Context, cfg *config.Config, log *slog.Logger, spans, history io.Writer, ready func(addr string)) error {
	var rdb redis.UniversalClient
	if cfg.Embedded() {
		m := miniredis.NewMiniRedis()
		m.ClockTTL(true) // leases expire by the wall clock, as on a real Redis
		if err := m.StartAddr("127.0.0.1:0"); err != nil {
			return fail(exitUnreachable, "embedded redis: %w", err)
		}
		defer m.Close()
		log.Warn("no redis configured: using an embedded in-process Redis; state is lost on exit and no other runner can join",
			slog.String("addr", m.Addr()))
		opts := cfg.RedisOptions()
		opts.Addrs = []string{m.Addr()}
		rdb = redis.NewUniversalClient(opts)
	} else {
		rdb = redis.NewUniversalClient(cfg.RedisOptions())
	}
	defer rdb.Close()
	if err := waitRedis(ctx, rdb, redisWait); err != nil {
		return fail(exitUnreachable, "redis unreachable: %w", err)
	}

	jobList, err := cfg.BuildJobs()
	if err != nil {
		return fail(exitUsage, "%w", err)
	}
	if len(jobList) == 0 {
		jobList = config.DemoJobs()
		log.Info("no jobs configured: registered the demo jobs course_sync, message_sync and backup")
	}
	for _, j := range jobList { // exec output goes to the log, line by line, with the run's attributes
		for _, st := range j.Stages {
			if es, ok := st.Handler.(*jobs.ExecStage); ok && es.Logger == nil {
				es.Logger = log
			}
		}
	}
	promReg := prometheus.NewRegistry()
	promReg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	rc := cfg.RegistryConfig()
	rc.Jobs, rc.Logger, rc.Metrics = jobList, log, promReg
	var tp trace.TracerProvider
	if cfg.TracingOn(os.Getenv) {
		exporter := os.Getenv("OTEL_TRACES_EXPORTER")
		if exporter != tracing.ExporterConsole {
			exporter = tracing.ExporterOTLP
		}
		p, err := tracing.Provider(ctx, tracing.Options{ServiceName: cfg.Tracing.ServiceName, Version: jobs.BuildVersion(),
			Instance: cfg.Runner.ID, Exporter: exporter, Console: spans})
		if err != nil {
			return fail(exitUsage, "%w", err)
		}
		defer func() { // flush the last spans
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			if err := p.Shutdown(sctx); err != nil {
				log.Warn("tracing: flushing spans failed", slog.Any("error", err))
			}
		}()
		tp, rc.TracerProvider = p, p
		if exporter == tracing.ExporterConsole {
			log.Info("tracing on: spans are written to standard output as JSON lines (OTEL_TRACES_EXPORTER=console)")
		} else {
			log.Info("tracing on: spans are exported with OTLP/HTTP (OTEL_EXPORTER_OTLP_ENDPOINT)")
		}
	}
	reg, err := jobs.NewRegistry(rdb, rc)
	if err != nil {
		return fail(exitUsage, "%w", err)
	}
	runCfg := cfg.RunnerConfig()
	runCfg.HistoryLog = history
	runner, err := jobs.NewRunner(reg, runCfg)
	if err != nil {
		return fail(exitUsage, "%w", err)
	}
	var scheds []triggers.Schedule
	for _, s := range cfg.Schedules {
		scheds = append(scheds, triggers.Schedule{Name: s.Name, Cron: s.Cron, Scope: s.Scope,
			Subjects: s.Subjects.List, AllSubjects: s.Subjects.All})
	}
	var sched *triggers.Scheduler
	if len(scheds) > 0 {
		sched, err = triggers.NewScheduler(rdb, reg, triggers.SchedulerConfig{
			Schedules: scheds, ID: runner.ID(), Owner: runner.Owner(), Prefix: reg.Prefix(), Logger: log})
		if err != nil {
			return fail(exitUsage, "%w", err)
		}
	}

	var subjects *apptoken.Verifier
	if st := cfg.HTTP.SubjectTokens; st.Enabled() {
		vc := st.Verifier()
		vc.Logger = log
		if subjects, err = apptoken.NewVerifier(ctx, vc); err != nil {
			return fail(exitUsage, "http.subjectTokens: %w", err)
		}
	}
	// Any credential configured makes every /v1 route require one.
	if cfg.HTTP.Token == "" && cfg.HTTP.ReadToken == "" && subjects == nil && !isLoopback(cfg.HTTP.Listen) {
		log.Warn("HTTP API listens beyond loopback WITHOUT a token: anyone who can reach it can submit and cancel runs; set http.token",
			slog.String("listen", cfg.HTTP.Listen))
	}
	hosts := allowedHosts(cfg.HTTP.Listen, cfg.HTTP.AllowedOrigins)
	if cfg.HTTP.Token == "" && isWildcardListen(cfg.HTTP.Listen) {
		// Without a token the API serves only requests addressed to these
		// names (DNS-rebinding protection), which a wildcard listen address
		// does not name: say so before someone reaches it by its IP.
		log.Info("HTTP API without a token serves only requests addressed to localhost, 127.0.0.1, [::1] or the hosts of http.allowedOrigins; other host names and IPs are answered 403 (set http.token to serve them)",
			slog.Any("hosts", hosts))
	}
	var schedules func(context.Context) ([]triggers.ScheduleStatus, error)
	if sched != nil {
		schedules = sched.Status
	}
	api := httpapi.New(reg, httpapi.Options{
		Token: cfg.HTTP.Token, BodyLimit: cfg.HTTP.BodyLimit, Logger: log,
		Metrics:        promhttp.HandlerFor(promReg, promhttp.HandlerOpts{}),
		AllowedOrigins: cfg.HTTP.AllowedOrigins, AllowedHosts: hosts,
		MaxEventClients: cfg.HTTP.MaxEventClients,
		ReadToken:       cfg.HTTP.ReadToken, Subjects: subjects, MaxSubjectStreams: cfg.HTTP.MaxSubjectStreams,
		Schedules:      schedules,
		TracerProvider: tp,
	})
	ln, err := net.Listen("tcp", cfg.HTTP.Listen)
	if err != nil {
		return fail(exitUsage, "listen %s: %w", cfg.HTTP.Listen, err)
	}
	srv := httpapi.NewServer(cfg.HTTP.Listen, api)
	shown := ln.Addr().String()
	if isWildcardListen(shown) {
		// "http://[::]:8080" is no address to open, and without a token the
		// API would refuse that Host anyway.
		_, port, _ := net.SplitHostPort(shown)
		shown = net.JoinHostPort("127.0.0.1", port)
	}
	log.Info("serving", slog.String("url", "http://"+shown), slog.String("runner", runner.Owner()))
	if ready != nil {
		ready(ln.Addr().String())
	}

	var wg sync.WaitGroup
	errs := make(chan error, 3)
	wg.Go(func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errs <- fmt.Errorf("http: %w", err)
		}
	})
	wg.Go(func() {
		if err := runner.Run(ctx); err != nil {
			errs <- fmt.Errorf("runner: %w", err)
		}
	})
	if sched != nil {
		wg.Go(func() {
			if err := sched.Run(ctx); err != nil {
				errs <- fmt.Errorf("scheduler: %w", err)
			}
		})
	}
	var runErr error
	select {
	case <-ctx.Done():
		log.Info("shutting down")
	case runErr = <-errs:
		log.Error("stopping after error", slog.Any("error", runErr))
	}
	shutCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutCtx) // SSE clients end with their request contexts
	wg.Wait()
	return runErr
}

// waitRedis pings until Redis answers or d passes.
func waitRedis(ctx context.Context, rdb redis.UniversalClient, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := rdb.Ping(pctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}

// isWildcardListen reports whether addr listens on every interface
// (":8080", "0.0.0.0:8080", "[::]:8080"), which names no host.
func isWildcardListen(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return host == "" || ip != nil && ip.IsUnspecified()
}

// allowedHosts are the host names the API serves without a token besides
// the loopback ones: the listen host unless it is a wildcard, and the host
// of every allowed origin (a page served under that name, e.g. through a
// proxy, is this runner's dashboard).
func allowedHosts(listen string, origins []string) []string {
	var hosts []string
	if host, _, err := net.SplitHostPort(listen); err == nil && !isWildcardListen(listen) {
		hosts = append(hosts, host)
	}
	for _, o := range origins {
		if u, err := url.Parse(o); err == nil && u.Hostname() != "" {
			hosts = append(hosts, u.Hostname())
		}
	}
	return hosts
}

func cmdValidate(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("validate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	cfgPath := fs.String("config", "", "config file (YAML)")
	pos, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if *cfgPath == "" && len(pos) == 1 {
		*cfgPath = pos[0]
	}
	if *cfgPath == "" {
		return fail(exitUsage, "validate needs --config FILE")
	}
	cfg, err := config.Load(*cfgPath)
	if err != nil {
		var probs config.Problems
		if errors.As(err, &probs) {
			fmt.Fprintf(stdout, "%s: %d problem(s)\n", *cfgPath, len(probs))
			for _, p := range probs {
				fmt.Fprintf(stdout, "  %s\n", p.String())
			}
			return &exitError{code: exitUsage, err: fmt.Errorf("%s is invalid", *cfgPath)}
		}
		return fail(exitUsage, "%w", err)
	}
	if _, err := cfg.BuildJobs(); err != nil {
		return fail(exitUsage, "%w", err)
	}
	fmt.Fprintf(stdout, "%s: ok (%d jobs, %d schedules)\n", *cfgPath, len(cfg.Jobs), len(cfg.Schedules))
	return nil
}
