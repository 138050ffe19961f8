// Package httpapi serves tasklease's HTTP API v1 (docs/http-api.md), the
// Server-Sent Events feed, health and readiness probes, Prometheus metrics
// and the embedded dashboard.
//
// Every entry point that is not Go code goes through here to the one
// Registry: the dashboard's "Sync now" button, a mobile app's foreground
// webhook, scripts and the CLI client. The handler only translates HTTP to
// Registry calls; it never executes work and never touches a lease.
//
// Wire conventions:
//
//   - JSON in and out; errors are {"error":{"code":"...","message":"..."}}
//     with codes bad_request (400), unauthorized (401), forbidden (403: a
//     cross-site or foreign-host request, below), not_found (404),
//     method_not_allowed (405), payload_too_large (413),
//     unsupported_media_type (415: a POST body not sent as
//     application/json), unavailable (503: Redis could not be reached or
//     did not answer in time) and too_many_clients (503 with Retry-After:
//     5, GET /v1/events already has Options.MaxEventClients streams open).
//   - POST .../runs answers 200 for every outcome, including "started":
//     the outcome field, not the status code, says what happened, so a
//     client has one success shape to handle.
//   - When Options.Token is set every /v1 route requires
//     "Authorization: Bearer <token>". Because browsers' EventSource cannot
//     send headers, GET /v1/events (and only that route) also accepts the
//     token as the query parameter access_token. /healthz, /readyz,
//     /metrics and the dashboard page are open: the page holds no data and
//     asks for the token itself.
//   - Browsers are hostile callers too (see browser.go). On every /v1
//     route, whatever the method (a cross-site page must not read the task
//     list or the feed either), a request whose Origin is not the origin
//     served (scheme from TLS or X-Forwarded-Proto, host:port from Host),
//     or whose Sec-Fetch-Site is neither same-origin nor none, is answered
//     403 forbidden, unless its Origin is listed in Options.AllowedOrigins.
//     same-site counts as cross-site: another port of localhost or a
//     sibling subdomain is another application. Listed origins get CORS
//     answers (Access-Control-Allow-Origin, Vary: Origin, preflight OPTIONS
//     answered 204 before authentication, no credentials); the origin "*"
//     does not exist. Requests with neither header (curl, the CLI, Go
//     clients) are not affected.
//   - Without a Token, only requests whose Host is a loopback name
//     (localhost, *.localhost, 127.0.0.0/8, [::1]) or one of
//     Options.AllowedHosts are served, so a DNS-rebinding page, which is
//     same-origin with itself, cannot reach a runner on a laptop: others
//     are answered 403. This covers /v1 and the dashboard page (and
//     unknown routes), but not /healthz, /readyz and /metrics, which load
//     balancers and Kubernetes probes call by pod IP. With a Token any
//     Host is served: browsers never attach the token by themselves.
//   - A POST with a body (Content-Length not 0) must declare Content-Type
//     application/json (parameters such as charset allowed), or it is
//     answered 415: the bodies a cross-site form can send without a
//     preflight are never JSON. A POST without a body passes whatever its
//     Content-Type. The order of checks is: Host, cross-site, preflight,
//     token (401), media type (415), then routing.
//   - Non-SSE requests run under a context deadline (RequestTimeout) and a
//     matching per-request write deadline; the SSE route has neither, which
//     is why NewServer leaves http.Server.WriteTimeout at 0.
package httpapi

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/tasklease/tasklease/internal/apptoken"
	"github.com/tasklease/tasklease/jobs"
	"github.com/tasklease/tasklease/taskkey"
	"github.com/tasklease/tasklease/triggers"
)

// Defaults and limits.
const (
	// BodyLimitDefault bounds request bodies when Options.BodyLimit is 0.
	BodyLimitDefault int64 = 1 << 20
	// MaxEventClientsDefault bounds concurrent GET /v1/events streams when
	// Options.MaxEventClients is 0.
	MaxEventClientsDefault = 100
	// MaxSubjectStreamsDefault bounds concurrent subject streams when
	// Options.MaxSubjectStreams is 0.
	MaxSubjectStreamsDefault = 10000
	// eventsRetryAfter is the Retry-After (seconds) of a 503
	// too_many_clients.
	eventsRetryAfter = "5"
	// RequestTimeout bounds every non-SSE request: its context (and so
	// every Redis call made for it) gets this deadline, and writing the
	// response must finish shortly after.
	RequestTimeout = 10 * time.Second
	// KeepAliveInterval is how often the SSE feed sends a comment so that
	// proxies and load balancers do not close an idle stream.
	KeepAliveInterval = 15 * time.Second
	// readyTimeout bounds one readiness probe; probes are frequent and a
	// slow Redis is as good as an absent one to a load balancer.
	readyTimeout = 2 * time.Second
	// writeGrace is added to RequestTimeout for the write deadline, so a
	// response computed just before the context deadline can still be sent.
	writeGrace = 5 * time.Second
	// sseWriteTimeout drops an SSE client that stops reading: each event
	// must be written within it, otherwise a stuck client would pin a
	// goroutine and a Redis subscription forever.
	sseWriteTimeout = 30 * time.Second
)

const eventsPath = "/v1/events"

// Options configure the handler built by New.
type Options struct {
	// Token, when set, is required as "Authorization: Bearer <token>" on
	// every /v1 route (compared in constant time). /healthz, /readyz,
	// /metrics and / stay open. GET /v1/events also accepts
	// ?access_token=<token> because EventSource cannot send headers.
	Token string
	// BodyLimit bounds request bodies (default BodyLimitDefault, 1 MiB);
	// larger bodies are answered 413.
	BodyLimit int64
	// Logger receives the access log (debug) and Redis failures (error).
	// Default slog.Default().
	Logger *slog.Logger
	// Metrics is served at GET /metrics, e.g. promhttp.HandlerFor(reg, ...).
	// nil answers 404.
	Metrics http.Handler
	// Ready decides /readyz (default: the registry's Redis Ping); an error
	// answers 503.
	Ready func(ctx context.Context) error
	// AllowedOrigins are the browser origins, scheme://host[:port] (see
	// ParseOrigin), whose pages may call the /v1 routes cross-origin: their
	// requests pass the cross-site check and get CORS answers. Any other
	// Origin than the one served, and any Sec-Fetch-Site other than
	// same-origin or none, is answered 403. There is no wildcard.
	AllowedOrigins []string
	// AllowedHosts are host names or IP addresses (a port is ignored)
	// served without a Token besides the loopback names (localhost,
	// *.localhost, 127.0.0.0/8, ::1); requests to any other Host are
	// answered 403 unless Token is set. cmd/runner fills it with the
	// listen host and the hosts of AllowedOrigins.
	AllowedHosts []string
	// TracerProvider, when set, traces every request (otelhttp): a server
	// span per request, continuing a W3C traceparent the caller sent, so a
	// submit's span is its child.
	TracerProvider trace.TracerProvider
	// Schedules answers GET /v1/schedules (e.g. (*triggers.Scheduler).Status);
	// nil answers an empty list.
	Schedules func(ctx context.Context) ([]triggers.ScheduleStatus, error)
	// MaxEventClients bounds concurrent GET /v1/events streams (default
	// MaxEventClientsDefault); one more is answered 503 too_many_clients
	// with Retry-After.
	MaxEventClients int
	// ReadToken, when set, is a second bearer token that may call the GET
	// routes only (a dashboard without actions); POSTs are answered 403.
	ReadToken string
	// Subjects, when set, verifies subject tokens (internal/apptoken): a
	// JWT that opens only its own subject's tasks (docs/app-access.md).
	Subjects *apptoken.Verifier
	// MaxSubjectStreams bounds concurrent GET /v1/subjects/{subject}/events
	// streams, apart from MaxEventClients (default
	// MaxSubjectStreamsDefault); one more is answered 503 too_many_clients.
	MaxSubjectStreams int
}

// settings are the knobs tests shorten; production uses the constants.
type settings struct {
	keepAlive      time.Duration
	requestTimeout time.Duration
	writeGrace     time.Duration
}

// api is the handler returned by New.
type api struct {
	reg      *jobs.Registry
	auth     bool // some credential is configured: /v1 needs one
	token    bool
	tokenSum [32]byte
	// readToken is Options.ReadToken; subjects verifies subject tokens.
	readToken    bool
	readTokenSum [32]byte
	subjects     *apptoken.Verifier
	bodyLimit    int64
	log          *slog.Logger
	metrics      http.Handler
	ready        func(context.Context) error
	// scheduleStatus is Options.Schedules.
	scheduleStatus func(context.Context) ([]triggers.ScheduleStatus, error)
	set            settings
	mux            *http.ServeMux
	guard          *guard
	// maxEvents bounds the SSE streams; openEvents counts them.
	maxEvents  int64
	openEvents atomic.Int64
	// subjectHub feeds the subject streams; maxSubject bounds them.
	subjectHub  *subjectHub
	maxSubject  int64
	openSubject atomic.Int64
}

// New returns the HTTP handler of the API v1, the SSE feed, the probes,
// the metrics endpoint and the dashboard, all backed by reg.
func New(reg *jobs.Registry, opts Options) http.Handler {
	a := newAPI(reg, opts, settings{keepAlive: KeepAliveInterval, requestTimeout: RequestTimeout, writeGrace: writeGrace})
	return traced(a, opts.TracerProvider)
}

// traced wraps h in otelhttp when tp is set. Spans are named by the route
// pattern ("POST /v1/tasks/{subject}/{scope}/runs"), never by the path.
func traced(a *api, tp trace.TracerProvider) http.Handler {
	if tp == nil {
		return a
	}
	return otelhttp.NewHandler(a, "tasklease.api", otelhttp.WithTracerProvider(tp),
		otelhttp.WithPropagators(propagation.TraceContext{}),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string {
			if _, pattern := a.mux.Handler(r); pattern != "" {
				return pattern
			}
			return r.Method + " (unknown route)"
		}))
}

func newAPI(reg *jobs.Registry, opts Options, set settings) *api {
	a := &api{
		reg:            reg,
		auth:           opts.authRequired(),
		token:          opts.Token != "",
		tokenSum:       sha256.Sum256([]byte(opts.Token)),
		readToken:      opts.ReadToken != "",
		readTokenSum:   sha256.Sum256([]byte(opts.ReadToken)),
		subjects:       opts.Subjects,
		bodyLimit:      opts.BodyLimit,
		log:            opts.Logger,
		metrics:        opts.Metrics,
		ready:          opts.Ready,
		scheduleStatus: opts.Schedules,
		set:            set,
		mux:            http.NewServeMux(),
	}
	if a.bodyLimit <= 0 {
		a.bodyLimit = BodyLimitDefault
	}
	if a.log == nil {
		a.log = slog.Default()
	}
	if a.ready == nil {
		a.ready = reg.Ping
	}
	a.maxEvents = int64(opts.MaxEventClients)
	if a.maxEvents <= 0 {
		a.maxEvents = MaxEventClientsDefault
	}
	a.maxSubject = int64(opts.MaxSubjectStreams)
	if a.maxSubject <= 0 {
		a.maxSubject = MaxSubjectStreamsDefault
	}
	a.subjectHub = newSubjectHub(reg, a.log)
	var errs []error
	a.guard, errs = newGuard(opts)
	for _, err := range errs {
		a.log.LogAttrs(context.Background(), slog.LevelError, "http: ignoring invalid option", slog.Any("error", err))
	}
	m := a.mux
	// Every /v1 route says whether subject tokens may call it (auth.go).
	m.HandleFunc("POST /v1/tasks/{subject}/{scope}/runs", a.allow(forSubject(apptoken.ActionSubmit), a.submit))
	m.HandleFunc("GET /v1/tasks/{subject}/{scope}", a.allow(forSubject(apptoken.ActionRead), a.get))
	m.HandleFunc("POST /v1/tasks/{subject}/{scope}/cancel", a.allow(forSubject(apptoken.ActionCancel), a.cancel))
	m.HandleFunc("GET /v1/tasks/{subject}/{scope}/history", a.allow(forSubject(apptoken.ActionRead), a.history))
	m.HandleFunc("GET /v1/subjects/{subject}/events", a.allow(forSubject(apptoken.ActionRead), a.subjectEvents))
	m.HandleFunc("POST /v1/hooks/foreground", a.allow(subjectAccess{action: apptoken.ActionSubmit, inBody: true}, a.foreground))
	m.HandleFunc("GET /v1/tasks", a.allow(operatorsOnly, a.list))
	m.HandleFunc("POST /v1/tasks/cancel", a.allow(operatorsOnly, a.cancelMatching))
	m.HandleFunc("GET /v1/scopes", a.allow(operatorsOnly, a.scopes))
	m.HandleFunc("POST /v1/scopes/{scope}/pause", a.allow(operatorsOnly, a.pause))
	m.HandleFunc("POST /v1/scopes/{scope}/resume", a.allow(operatorsOnly, a.resume))
	m.HandleFunc("GET /v1/runners", a.allow(operatorsOnly, a.runners))
	m.HandleFunc("GET /v1/limiters", a.allow(operatorsOnly, a.limiters))
	m.HandleFunc("GET /v1/schedules", a.allow(operatorsOnly, a.schedules))
	m.HandleFunc("GET "+eventsPath, a.allow(operatorsOnly, a.events))
	m.HandleFunc("GET /v1/openapi.json", a.allow(operatorsOnly, a.openapi))
	m.HandleFunc("GET /healthz", a.healthz)
	m.HandleFunc("GET /readyz", a.readyz)
	if a.metrics != nil {
		m.Handle("GET /metrics", a.metrics)
	}
	m.HandleFunc("GET /{$}", serveDashboard)
	return a
}

// ServeHTTP applies what every route shares: deadlines, authentication,
// JSON 404/405 and the access log.
func (a *api) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	rec := &recorder{ResponseWriter: w}
	defer func() {
		if a.log.Enabled(r.Context(), slog.LevelDebug) {
			// The path only: the query of /v1/events may carry the token.
			a.log.LogAttrs(r.Context(), slog.LevelDebug, "http",
				slog.String("method", r.Method), slog.String("path", r.URL.Path),
				slog.Int("status", rec.statusOr200()), slog.Duration("duration", time.Since(start)))
		}
	}()
	rec.Header().Set("X-Content-Type-Options", "nosniff")

	if !isStreamPath(r.URL.Path) {
		// http.Server.WriteTimeout must stay 0 for SSE, so the other routes
		// get their bound here: a context deadline for the work and a write
		// deadline for slow readers. Errors mean the writer cannot set
		// deadlines (e.g. a test recorder), where there is nothing to bound.
		ctx, cancel := context.WithTimeout(r.Context(), a.set.requestTimeout)
		defer cancel()
		r = r.WithContext(ctx)
		_ = http.NewResponseController(rec).SetWriteDeadline(time.Now().Add(a.set.requestTimeout + a.set.writeGrace))
	}

	// Browsers first: a foreign Host or a cross-site caller learns nothing,
	// not even whether its token would be right. Preflights carry no
	// token, so they are answered before authentication.
	if isAPIPath(r.URL.Path) && len(a.guard.origins) > 0 {
		rec.Header().Add("Vary", "Origin") // answers differ by Origin (CORS headers)
	}
	facts := factsOf(r)
	v := a.guard.admit(facts)
	if v.status != 0 {
		writeError(rec, v.status, v.code, v.msg)
		return
	}
	if v.allowOrigin != "" {
		// No Access-Control-Allow-Credentials: the API authenticates with
		// a bearer token, never with cookies.
		rec.Header().Set("Access-Control-Allow-Origin", v.allowOrigin)
		rec.Header().Set("Access-Control-Expose-Headers", "Retry-After, WWW-Authenticate")
	}
	if v.preflight {
		writePreflight(rec, r)
		return
	}

	if a.auth && isAPIPath(r.URL.Path) {
		// Checked before routing so unknown /v1 routes do not reveal which
		// routes exist. What each caller may do is checked per route
		// (allow, auth.go).
		p, msg := a.authenticate(r)
		if msg != "" {
			unauthorized(rec, msg)
			return
		}
		r = r.WithContext(context.WithValue(r.Context(), principalKey{}, p))
	}

	if msg := jsonBodyProblem(facts); msg != "" {
		writeError(rec, http.StatusUnsupportedMediaType, "unsupported_media_type", msg)
		return
	}

	if _, pattern := a.mux.Handler(r); pattern == "" {
		a.noRoute(rec, r)
		return
	}
	a.mux.ServeHTTP(rec, r)
}

// noRoute answers what the mux would (404, or 405 with its Allow header)
// in the API's JSON error shape.
func (a *api) noRoute(w http.ResponseWriter, r *http.Request) {
	h, _ := a.mux.Handler(r)
	probe := &headerProbe{header: http.Header{}}
	h.ServeHTTP(probe, r)
	if probe.status == http.StatusMethodNotAllowed {
		if allow := probe.header.Get("Allow"); allow != "" {
			w.Header().Set("Allow", allow)
		}
		writeError(w, http.StatusMethodNotAllowed, "method_not_allowed", fmt.Sprintf("method %s not allowed on %s", r.Method, r.URL.Path))
		return
	}
	writeError(w, http.StatusNotFound, "not_found", "no route "+r.URL.Path)
}

// NewServer returns an http.Server for h with timeouts suited to the API:
// ReadHeaderTimeout 5s, ReadTimeout 30s, IdleTimeout 120s, MaxHeaderBytes
// 64 KiB, and WriteTimeout 0 because the SSE feed is a response that never
// ends. Non-SSE routes are bounded per request by the handler from New
// (context deadline plus write deadline, RequestTimeout), not by
// http.TimeoutHandler, which would buffer responses and break flushing.
//
// Shutdown ends open SSE streams (through a channel in the server's base
// context), so a graceful shutdown does not wait for dashboards to close.
func NewServer(addr string, h http.Handler) *http.Server {
	shut := make(chan struct{})
	srv := &http.Server{
		Addr:              addr,
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      0,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
		BaseContext: func(net.Listener) context.Context {
			return context.WithValue(context.Background(), shutdownKey{}, (<-chan struct{})(shut))
		},
	}
	// RegisterOnShutdown funcs run on every Shutdown call (in their own
	// goroutines); closing twice would panic.
	var once sync.Once
	srv.RegisterOnShutdown(func() { once.Do(func() { close(shut) }) })
	return srv
}

// shutdownKey carries NewServer's shutdown channel in request contexts.
type shutdownKey struct{}

func shutdownChan(ctx context.Context) <-chan struct{} {
	ch, _ := ctx.Value(shutdownKey{}).(<-chan struct{})
	return ch // nil (blocks forever) outside NewServer
}

// errorBody is the API's error shape.
type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// badRequest is an input error found by the handler itself.
type badRequest struct{ msg string }

func (e *badRequest) Error() string { return e.msg }

func badRequestf(format string, args ...any) error {
	return &badRequest{msg: fmt.Sprintf(format, args...)}
}

// fail maps err to the API's status and code. Anything untyped is a Redis
// failure (the registry validates input before talking to Redis), so it is
// 503 and logged with its detail, which the client does not get.
func (a *api) fail(w http.ResponseWriter, r *http.Request, err error) {
	var (
		br  *badRequest
		mbe *http.MaxBytesError
	)
	switch {
	case errors.As(err, &mbe):
		writeError(w, http.StatusRequestEntityTooLarge, "payload_too_large", fmt.Sprintf("body larger than %d bytes", mbe.Limit))
	case errors.As(err, &br), errors.Is(err, taskkey.ErrInvalid),
		errors.Is(err, jobs.ErrInvalidSource), errors.Is(err, jobs.ErrInvalidPolicy), errors.Is(err, jobs.ErrInvalidStatus),
		errors.Is(err, jobs.ErrInvalidDelay), errors.Is(err, jobs.ErrInvalidGroup):
		writeError(w, http.StatusBadRequest, "bad_request", err.Error())
	case errors.Is(err, jobs.ErrUnknownScope), errors.Is(err, jobs.ErrNotFound):
		writeError(w, http.StatusNotFound, "not_found", err.Error())
	default:
		level := slog.LevelError
		if r.Context().Err() != nil && errors.Is(context.Cause(r.Context()), context.Canceled) {
			level = slog.LevelDebug // the client went away; nothing is wrong with Redis
		}
		a.log.LogAttrs(r.Context(), level, "http: redis unavailable",
			slog.String("method", r.Method), slog.String("path", r.URL.Path), slog.Any("error", err))
		writeError(w, http.StatusServiceUnavailable, "unavailable", "redis unavailable")
	}
}

// unauthorized answers 401 with the Bearer challenge (RFC 6750).
func unauthorized(w http.ResponseWriter, msg string) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="tasklease"`)
	writeError(w, http.StatusUnauthorized, "unauthorized", msg)
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, errorBody{Error: errorDetail{Code: code, Message: msg}})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil { // only if a type cannot marshal: a bug, not input
		status = http.StatusInternalServerError
		b = []byte(`{"error":{"code":"internal","message":"cannot encode response"}}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

// recorder remembers the status for the access log. Unwrap lets
// http.ResponseController reach the connection (deadlines, flushing).
type recorder struct {
	http.ResponseWriter
	status int
}

func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.ResponseWriter.Write(b)
}

// Flush serves handlers that type-assert http.Flusher instead of using
// http.ResponseController.
func (r *recorder) Flush() {
	_ = http.NewResponseController(r.ResponseWriter).Flush()
}

func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

func (r *recorder) statusOr200() int {
	if r.status == 0 {
		return http.StatusOK
	}
	return r.status
}

// headerProbe captures the status and headers the mux's own 404/405
// handlers would send, discarding their text body.
type headerProbe struct {
	header http.Header
	status int
}

func (p *headerProbe) Header() http.Header         { return p.header }
func (p *headerProbe) Write(b []byte) (int, error) { return len(b), nil }
func (p *headerProbe) WriteHeader(code int)        { p.status = code }
