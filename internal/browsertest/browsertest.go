// Package browsertest drives pages in real headless Chromium (Debian's
// chromium package) for tests: find the browser or skip, poll the page
// for a condition with a deadline instead of sleeping, click in the step
// that finds the element, save screenshots to $TASKLEASE_ARTIFACTS, and
// list every URL the page requested, to check that it reached no other
// host.
package browsertest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
)

// RequireEnv set to 1 makes a missing Chromium a failure instead of a skip
// (.ci/run sets it).
const RequireEnv = "TASKLEASE_REQUIRE_BROWSER"

// ArtifactsEnv names the directory screenshots are saved to (default: the
// test's temp dir).
const ArtifactsEnv = "TASKLEASE_ARTIFACTS"

// ChromiumPath finds Chromium on PATH, or skips the test (fails it with
// TASKLEASE_REQUIRE_BROWSER=1).
func ChromiumPath(t testing.TB) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv(RequireEnv) == "1" {
		t.Fatalf("no chromium on PATH and %s=1", RequireEnv)
	}
	t.Skip("no chromium on PATH (apt-get install chromium)")
	return ""
}

// Request is one request the page made.
type Request struct {
	Method, URL string
	// Authorization is the request's Authorization header, as the page
	// set it ("" without one).
	Authorization string
}

// Browser is one headless Chromium tab.
type Browser struct {
	t testing.TB
	// Ctx is the tab's context, for chromedp.Run.
	Ctx context.Context
	// Dir is where Shot saves screenshots.
	Dir string

	mu   sync.Mutex
	reqs []Request
}

// Options tune New.
type Options struct {
	// Width and Height of the window (default 1440 × 1000).
	Width, Height int
	// Timeout bounds the whole session (default 3 minutes).
	Timeout time.Duration
}

// New starts Chromium (or skips, see ChromiumPath) with a fresh profile;
// it is stopped when the test ends.
func New(t testing.TB, o Options) *Browser {
	t.Helper()
	path := ChromiumPath(t)
	if o.Width == 0 || o.Height == 0 {
		o.Width, o.Height = 1440, 1000
	}
	if o.Timeout == 0 {
		o.Timeout = 3 * time.Minute
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Flag("headless", true),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-default-apps", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(o.Width, o.Height),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(actx)
	ctx, cancelTimeout := context.WithTimeout(ctx, o.Timeout)
	t.Cleanup(func() { cancelTimeout(); cancelTab(); cancelAlloc() })
	dir := os.Getenv(ArtifactsEnv)
	if dir == "" {
		dir = t.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b := &Browser{t: t, Ctx: ctx, Dir: dir}
	err := chromedp.Listen(ctx, func(ev any) {
		if e, ok := ev.(*network.EventRequestWillBeSent); ok {
			r := Request{Method: e.Request.Method, URL: e.Request.URL}
			for k, v := range e.Request.Headers {
				if strings.EqualFold(k, "Authorization") {
					r.Authorization, _ = v.(string)
				}
			}
			b.mu.Lock()
			b.reqs = append(b.reqs, r)
			b.mu.Unlock()
		}
	})
	if err != nil {
		t.Fatalf("chromium: %v", err)
	}
	return b
}

// Run runs actions, failing the test (after a screenshot "failed") on an
// error.
func (b *Browser) Run(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	if err := chromedp.Do(b.Ctx, actions...); err != nil {
		b.Shot("failed")
		b.t.Fatalf("%s: %v", what, err)
	}
}

// Until polls a JavaScript condition (an expression yielding a boolean)
// until it holds, failing after d with a screenshot "timeout" and the
// page's text for context.
func (b *Browser) Until(d time.Duration, what, expr string) {
	b.t.Helper()
	deadline := time.Now().Add(d)
	for {
		ok, err := chromedp.Run(b.Ctx, chromedp.Evaluate[bool]("Boolean("+expr+")"))
		if err != nil {
			b.t.Fatalf("%s: %v", what, err)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			b.Shot("timeout")
			text, _ := chromedp.Run(b.Ctx, chromedp.Evaluate[string](`document.body.innerText.slice(0, 3000)`))
			b.t.Fatalf("timed out after %s waiting for %s; page:\n%s", d, what, text)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Soon polls a JavaScript condition for at most d and reports whether it
// held; for what only makes a screenshot nicer.
func (b *Browser) Soon(d time.Duration, expr string) bool {
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if ok, err := chromedp.Run(b.Ctx, chromedp.Evaluate[bool]("Boolean("+expr+")")); err == nil && ok {
			return true
		}
	}
	return false
}

// Press clicks the element sel finds, in the page, in the same step that
// finds it: a live page re-renders, so a node looked up first may be gone
// by the time a separate click lands ("Could not find node with given
// id"). It waits up to 10 s for the element to exist and be enabled.
func (b *Browser) Press(what, sel string) {
	b.t.Helper()
	b.Until(10*time.Second, what, fmt.Sprintf(`(() => { const el = document.querySelector(%q); if (!el || el.disabled) return false; el.click(); return true })()`, sel))
}

// Text is the trimmed text of the element sel finds ("" if none).
func (b *Browser) Text(sel string) string {
	b.t.Helper()
	s, err := chromedp.Run(b.Ctx, chromedp.Evaluate[string](fmt.Sprintf(`(document.querySelector(%q)?.textContent ?? "").trim()`, sel)))
	if err != nil {
		b.t.Fatalf("text of %s: %v", sel, err)
	}
	return s
}

// Eval evaluates a JavaScript expression, awaiting a promise, and returns
// its value.
func Eval[T any](b *Browser, expr string) T {
	b.t.Helper()
	v, err := chromedp.Run(b.Ctx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		b.t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// Shot saves a full-page screenshot as <Dir>/<name>.png and returns its
// path ("" if it failed; a failed screenshot is logged, not fatal).
func (b *Browser) Shot(name string) string {
	buf, err := chromedp.Run(b.Ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Logf("screenshot %s: %v", name, err)
		return ""
	}
	p := filepath.Join(b.Dir, name+".png")
	if err := os.WriteFile(p, buf, 0o644); err != nil {
		b.t.Logf("screenshot %s: %v", name, err)
		return ""
	}
	b.t.Logf("screenshot: %s", p)
	return p
}

// Requests returns every request the page made so far, in order.
func (b *Browser) Requests() []Request {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]Request(nil), b.reqs...)
}

// Foreign returns the requested URLs on none of origins (scheme://host:port;
// data: URLs are no request to a host).
func (b *Browser) Foreign(origins ...string) []string {
	var out []string
	for _, r := range b.Requests() {
		if strings.HasPrefix(r.URL, "data:") {
			continue
		}
		own := false
		for _, o := range origins {
			if r.URL == o || strings.HasPrefix(r.URL, o+"/") {
				own = true
				break
			}
		}
		if !own {
			out = append(out, r.URL)
		}
	}
	return out
}

// JS is an action that runs a script for its effect.
func JS(expr string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, t *chromedp.Target) error {
		_, err := chromedp.Evaluate[any](expr)(ctx, t)
		return err
	})
}
