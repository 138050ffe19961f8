package httpapi

import (
	"bytes"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"net/http"
	"strings"
)

// dashboardHTML is the whole dashboard: one self-contained page (inline CSS
// and JS, no external assets) that talks only to this API.
//
//go:embed dashboard/index.html
var dashboardHTML []byte

// dashboardCSP allows exactly the page's own inline script and style (by
// hash) and same-origin fetch/EventSource: even if task data (subjects,
// error texts) slipped into markup, no injected script could run.
var dashboardCSP = buildCSP(dashboardHTML)

func serveDashboard(w http.ResponseWriter, _ *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	h.Set("Content-Security-Policy", dashboardCSP)
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	_, _ = w.Write(dashboardHTML)
}

func buildCSP(page []byte) string {
	return "default-src 'none'" +
		"; script-src " + inlineHashes(page, "<script>", "</script>") +
		"; style-src " + inlineHashes(page, "<style>", "</style>") +
		"; connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
}

// inlineHashes returns the CSP source list ('sha256-...' each) of every
// element opened by open (exactly, without attributes) in page.
func inlineHashes(page []byte, open, close string) string {
	var srcs []string
	for rest := page; ; {
		i := bytes.Index(rest, []byte(open))
		if i < 0 {
			break
		}
		rest = rest[i+len(open):]
		j := bytes.Index(rest, []byte(close))
		if j < 0 {
			break
		}
		sum := sha256.Sum256(rest[:j])
		srcs = append(srcs, "'sha256-"+base64.StdEncoding.EncodeToString(sum[:])+"'")
		rest = rest[j+len(close):]
	}
	if len(srcs) == 0 {
		return "'none'"
	}
	return strings.Join(srcs, " ")
}
