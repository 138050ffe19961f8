package jobs

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/propagation"
)

// HTTPTimeoutDefault is the request timeout of HTTPStage's default client.
const HTTPTimeoutDefault = 30 * time.Second

const (
	// httpDrainMax bounds how much of a response body is read, so a huge
	// body cannot stall the stage; the rest is dropped with the connection.
	httpDrainMax = 64 << 10
	// httpErrBodyMax is how much of a failed response goes into the error.
	httpErrBodyMax = 512
	// HTTPFencingTokenHeader carries the run's fencing token.
	HTTPFencingTokenHeader = "Tasklease-Fencing-Token"
	// HTTPKeyHeader carries the run's task key, so a downstream guard can
	// check the token without parsing the body (docs/stages.md, §10).
	HTTPKeyHeader = "Tasklease-Key"
	// HTTPLimiterSlotsHeader carries the limiter slots the run holds,
	// "name:slot:token,..." (Run.LimiterSlots); absent without limiters.
	HTTPLimiterSlotsHeader = "Tasklease-Limiter-Slots"
)

// httpDefaultClient is shared so idle connections are reused across runs.
var httpDefaultClient = &http.Client{Timeout: HTTPTimeoutDefault}

// HTTPStage POSTs the run to a URL per stage execution.
//
// The body is JSON: {"key", "subject", "scope", "stage", "runId",
// "attempt", "source", "fencingToken", "resumed"}; the key and the fencing
// token are also sent in the Tasklease-Key and Tasklease-Fencing-Token
// headers. A 2xx response completes
// the stage; 409 means the receiver saw a newer token and fails the run with
// ErrStaleToken (no retry); any other status or a transport error is a
// retryable failure.
type HTTPStage struct {
	// URL is the http or https endpoint. Required.
	URL string
	// Header holds extra request headers. Content-Type and the fencing
	// token header are always set by the stage.
	Header map[string]string
	// Client sends the request (default: a shared client with timeout
	// HTTPTimeoutDefault).
	Client *http.Client
}

// httpStageBody is the JSON body of an HTTPStage request.
type httpStageBody struct {
	Key          string `json:"key"`
	Subject      string `json:"subject"`
	Scope        string `json:"scope"`
	Stage        string `json:"stage"`
	RunID        string `json:"runId"`
	Attempt      int    `json:"attempt"`
	Source       Source `json:"source"`
	FencingToken int64  `json:"fencingToken"`
	Resumed      bool   `json:"resumed"`
}

// Validate checks the configuration; errors wrap ErrConfig.
func (h *HTTPStage) Validate() error {
	_, err := h.parseURL()
	return err
}

// parseURL validates and parses h.URL.
func (h *HTTPStage) parseURL() (*url.URL, error) {
	if h.URL == "" {
		return nil, fmt.Errorf("%w: http stage: empty URL", ErrConfig)
	}
	u, err := url.Parse(h.URL)
	if err != nil {
		// url.Error quotes the URL, which may hold credentials; keep only
		// the reason.
		if ue, ok := err.(*url.Error); ok {
			err = ue.Err
		}
		return nil, fmt.Errorf("%w: http stage: invalid URL: %w", ErrConfig, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("%w: http stage %s: scheme must be http or https", ErrConfig, u.Redacted())
	}
	if u.Host == "" {
		return nil, fmt.Errorf("%w: http stage %s: no host", ErrConfig, u.Redacted())
	}
	return u, nil
}

// RunStage POSTs the run and maps the response status to the stage result.
// When ctx is done the request is abandoned and the error wraps
// context.Cause(ctx).
func (h *HTTPStage) RunStage(ctx context.Context, run *Run) error {
	u, err := h.parseURL()
	if err != nil {
		return Permanent(err)
	}
	target := u.Redacted() // for errors and logs: no password
	body, err := json.Marshal(httpStageBody{
		Key:          run.Key().String(),
		Subject:      run.Subject(),
		Scope:        run.Scope(),
		Stage:        run.Stage(),
		RunID:        run.RunID(),
		Attempt:      run.Attempt(),
		Source:       run.Source(),
		FencingToken: run.FencingToken(),
		Resumed:      run.Resumed(),
	})
	if err != nil {
		return fmt.Errorf("http %s: encode body: %w", target, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(body))
	if err != nil {
		return Permanent(fmt.Errorf("http %s: %w", target, err))
	}
	for k, v := range h.Header {
		req.Header.Set(k, v)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(HTTPFencingTokenHeader, strconv.FormatInt(run.FencingToken(), 10))
	req.Header.Set(HTTPKeyHeader, run.Key().String())
	if len(run.slots) > 0 {
		req.Header.Set(HTTPLimiterSlotsHeader, limiterSlotsText(run.slots))
	}
	traceContext.Inject(ctx, propagation.HeaderCarrier(req.Header)) // traceparent, when tracing is on

	client := h.Client
	if client == nil {
		client = httpDefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			// Wrap the cause so the runner can tell cancel from lease loss.
			return fmt.Errorf("http %s: stopped: %w", target, context.Cause(ctx))
		}
		// url.Error repeats the full URL; unwrap to the reason.
		if ue, ok := err.(*url.Error); ok {
			err = ue.Err
		}
		return fmt.Errorf("http %s: %w", target, err)
	}
	lr := io.LimitReader(resp.Body, httpDrainMax)
	defer func() {
		// Drain (bounded) so the connection can be reused.
		_, _ = io.Copy(io.Discard, lr)
		_ = resp.Body.Close()
	}()

	if resp.StatusCode >= 200 && resp.StatusCode <= 299 {
		return nil
	}
	snippet, _ := io.ReadAll(io.LimitReader(lr, httpErrBodyMax))
	msg := strings.TrimSpace(strings.ToValidUTF8(string(snippet), "\uFFFD"))
	if msg != "" {
		msg = ": " + msg
	}
	if resp.StatusCode == http.StatusConflict {
		return fmt.Errorf("http %s: status %d: %w%s", target, resp.StatusCode, ErrStaleToken, msg)
	}
	err = fmt.Errorf("http %s: status %d%s", target, resp.StatusCode, msg)
	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
		// The remote asked us to slow down: not the run's fault, so the
		// attempt is not counted (RetryAfter).
		if d, ok := parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
			return RetryAfter(d, err)
		}
	}
	return err
}
