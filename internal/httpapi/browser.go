package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
)

// This file holds the API's defences against hostile browsers (docs/http-api.md):
// cross-site requests (CSRF and cross-site reads), DNS rebinding and
// non-JSON POST bodies. The decisions are pure functions of a few request
// facts (reqFacts), so they can be fuzzed without a server.

// preflightMaxAge is how long (seconds) a browser may cache a preflight.
const preflightMaxAge = "600"

// maxEcho bounds request values quoted back in error messages.
const maxEcho = 100

// ParseOrigin checks that s is a web origin as browsers write it in the
// Origin header, scheme://host[:port] with scheme http or https and nothing
// more: no path (not even "/"), query, fragment, user info or wildcard
// ("*" is refused: every allowed origin is named). It returns the origin
// normalized as browsers serialize it: scheme and host lower-cased, IPv6
// in canonical form, the scheme's default port (80, 443) dropped.
func ParseOrigin(s string) (string, error) {
	if s == "" {
		return "", errors.New("empty origin: want scheme://host[:port], e.g. https://dash.example.com")
	}
	if strings.Contains(s, "*") {
		return "", fmt.Errorf("%q: wildcards are not allowed; list each origin as scheme://host[:port]", truncate(s))
	}
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok {
		return "", fmt.Errorf("%q is not an origin: want scheme://host[:port], e.g. https://dash.example.com", truncate(s))
	}
	scheme = strings.ToLower(scheme)
	if scheme != "http" && scheme != "https" {
		return "", fmt.Errorf("%q: scheme must be http or https", truncate(s))
	}
	if strings.ContainsAny(rest, "/?#@\\") {
		return "", fmt.Errorf("%q: an origin is only scheme://host[:port], without path (not even a trailing /), query or user info", truncate(s))
	}
	auth, _, err := parseAuthority(scheme, rest)
	if err != nil {
		return "", fmt.Errorf("%q: %v", truncate(s), err)
	}
	return scheme + "://" + auth, nil
}

// parseAuthority checks host[:port] (a Host header or the authority of an
// origin) and returns it normalized for scheme, "host" or "host:port"
// (IPv6 in brackets), and the bare host name. An empty port (host:) is
// allowed, as in RFC 9110, and dropped like a default one.
func parseAuthority(scheme, hp string) (auth, host string, err error) {
	var port string
	if strings.HasPrefix(hp, "[") {
		end := strings.IndexByte(hp, ']')
		if end < 0 {
			return "", "", errors.New("unclosed [ in host")
		}
		a, err := netip.ParseAddr(hp[1:end])
		if err != nil || !a.Is6() || a.Zone() != "" {
			return "", "", errors.New("invalid IPv6 address in brackets")
		}
		host = a.String()
		switch after := hp[end+1:]; {
		case after == "":
		case after[0] == ':':
			port = after[1:]
		default:
			return "", "", errors.New("unexpected text after ]")
		}
	} else {
		host = hp
		if i := strings.IndexByte(hp, ':'); i >= 0 {
			host, port = hp[:i], hp[i+1:]
		}
		if host == "" {
			return "", "", errors.New("no host")
		}
		for i := 0; i < len(host); i++ {
			c := host[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_') {
				return "", "", errors.New("host must be a DNS name (punycode for international names) or an IP address")
			}
		}
		host = strings.ToLower(host)
	}
	if port != "" {
		n, err := strconv.ParseUint(port, 10, 16)
		if err != nil || n == 0 || port[0] == '+' {
			return "", "", errors.New("port must be a number in 1..65535")
		}
		port = strconv.FormatUint(n, 10)
	}
	if scheme == "http" && port == "80" || scheme == "https" && port == "443" {
		port = ""
	}
	auth = host
	if strings.Contains(host, ":") {
		auth = "[" + host + "]"
	}
	if port != "" {
		auth += ":" + port
	}
	return auth, host, nil
}

// hostName returns the host of a Host header value, port and one trailing
// dot removed, lower-cased; "" if the value is malformed.
func hostName(hostHeader string) string {
	_, h, err := parseAuthority("", hostHeader)
	if err != nil {
		return ""
	}
	return strings.TrimSuffix(h, ".")
}

// isLoopbackName reports whether a host name (from hostName) always means
// this machine, whatever DNS says: localhost, *.localhost (RFC 6761, which
// browsers resolve to loopback themselves), 127.0.0.0/8 and ::1.
func isLoopbackName(h string) bool {
	if h == "localhost" || strings.HasSuffix(h, ".localhost") {
		return true
	}
	a, err := netip.ParseAddr(h)
	return err == nil && a.Unmap().IsLoopback()
}

// guard holds the configured exceptions the browser checks allow.
type guard struct {
	token   bool            // Options.Token is set: any Host is served
	origins map[string]bool // normalized Options.AllowedOrigins
	hosts   map[string]bool // hostName of each Options.AllowedHosts
}

// newGuard normalizes the configured origins and hosts. Invalid entries are
// returned as errors and left out: they never match, so the guard fails
// closed (internal/config rejects them before they get here).
func newGuard(opts Options) (*guard, []error) {
	g := &guard{token: opts.authRequired(), origins: map[string]bool{}, hosts: map[string]bool{}}
	var errs []error
	for _, o := range opts.AllowedOrigins {
		n, err := ParseOrigin(o)
		if err != nil {
			errs = append(errs, fmt.Errorf("allowed origin %v", err))
			continue
		}
		g.origins[n] = true
	}
	for _, h := range opts.AllowedHosts {
		n := hostName(strings.TrimSpace(h))
		if n == "" {
			errs = append(errs, fmt.Errorf("allowed host %q is not a host name or IP address", truncate(h)))
			continue
		}
		g.hosts[n] = true
	}
	return g, errs
}

// reqFacts are the parts of a request the browser checks look at.
type reqFacts struct {
	method, path   string
	host           string // Host header (r.Host)
	tls            bool   // served over TLS by this process
	forwardedProto string // X-Forwarded-Proto, set by a TLS-terminating proxy
	origin         string // Origin header
	fetchSite      string // Sec-Fetch-Site header
	preflightFor   string // Access-Control-Request-Method header
	contentType    string
	contentLength  int64 // -1: unknown (chunked)
}

func factsOf(r *http.Request) reqFacts {
	return reqFacts{
		method:         r.Method,
		path:           r.URL.Path,
		host:           r.Host,
		tls:            r.TLS != nil,
		forwardedProto: r.Header.Get("X-Forwarded-Proto"),
		origin:         r.Header.Get("Origin"),
		fetchSite:      r.Header.Get("Sec-Fetch-Site"),
		preflightFor:   r.Header.Get("Access-Control-Request-Method"),
		contentType:    r.Header.Get("Content-Type"),
		contentLength:  r.ContentLength,
	}
}

// isAPIPath reports whether p is under /v1 (authentication, the
// cross-site check and the JSON body rule apply).
func isAPIPath(p string) bool { return p == "/v1" || strings.HasPrefix(p, "/v1/") }

// isProbePath reports whether p is a probe that must answer whatever Host a
// load balancer or kubelet uses (a pod IP): /healthz, /readyz, /metrics.
func isProbePath(p string) bool { return p == "/healthz" || p == "/readyz" || p == "/metrics" }

// verdict is the outcome of guard.admit.
type verdict struct {
	// status is 0 to go on, or 403 (code forbidden, msg).
	status    int
	code, msg string
	// allowOrigin, when set, is the request's listed Origin, to answer in
	// Access-Control-Allow-Origin.
	allowOrigin string
	// preflight: answer the CORS preflight (204) instead of routing.
	preflight bool
}

// servedOrigin is the origin the request was addressed to, normalized, or
// "" if its Host is malformed. The scheme is https over TLS, or when a
// proxy says so in X-Forwarded-Proto (a page cannot set that header on a
// cross-origin request without a preflight, which is refused).
func (f reqFacts) servedOrigin() string {
	scheme := "http"
	if f.tls {
		scheme = "https"
	} else if p, _, _ := strings.Cut(f.forwardedProto, ","); strings.EqualFold(strings.TrimSpace(p), "https") {
		scheme = "https"
	}
	auth, _, err := parseAuthority(scheme, f.host)
	if err != nil {
		return ""
	}
	return scheme + "://" + auth
}

// admit applies the Host allow-list (without a token; every route but the
// probes) and the cross-site check (every /v1 route, any method).
func (g *guard) admit(f reqFacts) verdict {
	if isProbePath(f.path) {
		return verdict{}
	}
	if !g.token {
		if h := hostName(f.host); !isLoopbackName(h) && !g.hosts[h] {
			return forbidden(fmt.Sprintf("Host %q is not served without a token (protection against DNS rebinding): "+
				"set http.token, or name this host in http.listen or in an http.allowedOrigins entry; loopback names are always served",
				truncate(f.host)))
		}
	}
	if !isAPIPath(f.path) {
		return verdict{}
	}
	origin := strings.TrimSpace(f.origin)
	if origin != "" {
		n, err := ParseOrigin(origin)
		if err == nil && g.origins[n] {
			// A listed origin may call from anywhere: Sec-Fetch-Site
			// says cross-site or same-site for it, by definition.
			return verdict{allowOrigin: origin, preflight: f.method == http.MethodOptions && f.preflightFor != ""}
		}
		if origin == "null" {
			return forbidden(`request from an opaque origin (Origin: null: a sandboxed frame, a local file or a cross-site redirect) refused; ` +
				`only a page whose origin is listed in http.allowedOrigins may call this API cross-origin`)
		}
		if err != nil || n != f.servedOrigin() {
			return forbidden(fmt.Sprintf("cross-origin request from %q refused: list that origin in http.allowedOrigins to let a page there call this API",
				truncate(origin)))
		}
	}
	switch site := strings.ToLower(strings.TrimSpace(f.fetchSite)); site {
	case "", "same-origin", "none":
	default:
		// same-site too: another port of localhost, or a sibling
		// subdomain, is another web application.
		return forbidden(fmt.Sprintf("cross-site request refused (Sec-Fetch-Site: %s): list the calling page's origin in http.allowedOrigins to allow it",
			truncate(site)))
	}
	return verdict{}
}

// jsonBodyProblem returns why a /v1 request with a body is refused (415):
// a POST whose body is not declared application/json (parameters such as
// charset allowed). Cross-site forms can only send form or text/plain
// bodies; application/json from another origin needs a preflight. A POST
// with no body (Content-Length 0, as curl -X POST sends) passes whatever
// its Content-Type.
func jsonBodyProblem(f reqFacts) string {
	if f.method != http.MethodPost || f.contentLength == 0 || !isAPIPath(f.path) {
		return ""
	}
	mt, _, _ := strings.Cut(f.contentType, ";")
	if strings.EqualFold(strings.Trim(mt, " \t"), "application/json") {
		return ""
	}
	got := "no Content-Type"
	if f.contentType != "" {
		got = fmt.Sprintf("Content-Type %q", truncate(f.contentType))
	}
	return "a POST body must be JSON: send Content-Type: application/json (got " + got + ")"
}

func forbidden(msg string) verdict {
	return verdict{status: http.StatusForbidden, code: "forbidden", msg: msg}
}

// writePreflight answers a CORS preflight from a listed origin.
func writePreflight(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Add("Vary", "Access-Control-Request-Method")
	h.Add("Vary", "Access-Control-Request-Headers")
	h.Set("Access-Control-Allow-Methods", "GET, POST")
	h.Set("Access-Control-Allow-Headers", "Authorization, Content-Type")
	h.Set("Access-Control-Max-Age", preflightMaxAge)
	if strings.EqualFold(r.Header.Get("Access-Control-Request-Private-Network"), "true") {
		// Chrome's Private Network Access: a listed public page calling a
		// runner on a private address asks for this too.
		h.Set("Access-Control-Allow-Private-Network", "true")
	}
	w.WriteHeader(http.StatusNoContent)
}

// truncate shortens request values quoted in messages.
func truncate(s string) string {
	if len(s) <= maxEcho {
		return s
	}
	return s[:maxEcho] + "..."
}
