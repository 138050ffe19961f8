package httpapi

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/tasklease/tasklease/internal/apptoken"
)

// This file holds who may call what (docs/app-access.md, DESIGN §12):
//
//   - the operator token (Options.Token): every route;
//   - the read-only token (Options.ReadToken): GET routes only;
//   - a subject token (Options.Subjects, a JWT): only its own subject's
//     submit, view, history, cancel, foreground hook and event stream,
//     within its tasklease_scopes and tasklease_actions.
//
// Authentication (401) happens before routing, in ServeHTTP; authorization
// (403) in the wrapper every route is registered with (allow), once the mux
// has decoded the path values, and, for the foreground hook whose subject is
// in the body, in the handler. A refused request changes nothing.

// role is the kind of credential a request authenticated with.
type role int

const (
	roleOpen     role = iota // no credential configured: every route (loopback)
	roleOperator             // Options.Token
	roleReader               // Options.ReadToken
	roleSubject              // a subject token
)

// principal is the caller, in the request's context.
type principal struct {
	role  role
	grant apptoken.Grant // roleSubject only
}

type principalKey struct{}

func principalOf(ctx context.Context) principal {
	p, _ := ctx.Value(principalKey{}).(principal)
	return p
}

// authRequired reports whether /v1 requests need a credential.
func (o Options) authRequired() bool {
	return o.Token != "" || o.ReadToken != "" || o.Subjects != nil
}

// bearer returns the request's token: the Authorization header, or, on the
// event streams only (EventSource cannot send headers), ?access_token=.
func bearer(r *http.Request) string {
	if scheme, tok, ok := strings.Cut(r.Header.Get("Authorization"), " "); ok && strings.EqualFold(scheme, "Bearer") {
		return strings.TrimSpace(tok)
	}
	if isStreamPath(r.URL.Path) {
		return r.URL.Query().Get("access_token")
	}
	return ""
}

// isStreamPath reports whether p is an SSE route: GET /v1/events or
// GET /v1/subjects/{subject}/events.
func isStreamPath(p string) bool {
	return p == eventsPath || strings.HasPrefix(p, "/v1/subjects/") && strings.HasSuffix(p, "/events")
}

// authenticate returns the caller, or a 401 message. Static tokens are
// hashed first so the constant-time comparison does not leak their length
// either. Messages never quote the token.
func (a *api) authenticate(r *http.Request) (principal, string) {
	got := bearer(r)
	if got == "" {
		return principal{}, "missing bearer token"
	}
	sum := sha256.Sum256([]byte(got))
	if a.token && subtle.ConstantTimeCompare(sum[:], a.tokenSum[:]) == 1 {
		return principal{role: roleOperator}, ""
	}
	if a.readToken && subtle.ConstantTimeCompare(sum[:], a.readTokenSum[:]) == 1 {
		return principal{role: roleReader}, ""
	}
	if a.subjects != nil && strings.Count(got, ".") == 2 {
		g, err := a.subjects.Verify(got)
		if err == nil {
			return principal{role: roleSubject, grant: g}, ""
		}
		var ref *apptoken.Refusal
		if errors.As(err, &ref) {
			return principal{}, ref.Error()
		}
		return principal{}, "subject token refused"
	}
	return principal{}, "wrong bearer token"
}

// subjectAccess says how a route is open to subject tokens.
type subjectAccess struct {
	// action the route needs; "" closes the route to subject tokens.
	action apptoken.Action
	// inBody: the subject (and scopes) are in the body, checked by the
	// handler (the foreground hook); otherwise the path's {subject} and
	// {scope} are.
	inBody bool
}

// operatorsOnly closes a route to subject tokens.
var operatorsOnly = subjectAccess{}

func forSubject(a apptoken.Action) subjectAccess { return subjectAccess{action: a} }

// allow wraps a route's handler with its authorization.
func (a *api) allow(acc subjectAccess, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p := principalOf(r.Context())
		switch p.role {
		case roleOpen, roleOperator:
		case roleReader:
			if r.Method != http.MethodGet && r.Method != http.MethodHead {
				writeError(w, http.StatusForbidden, "forbidden", "the read-only token (http.readToken) may only GET")
				return
			}
		case roleSubject:
			if msg := subjectRefusal(p.grant, acc, r); msg != "" {
				writeError(w, http.StatusForbidden, "forbidden", msg)
				return
			}
		default:
			writeError(w, http.StatusForbidden, "forbidden", "unknown caller")
			return
		}
		h(w, r)
	}
}

// subjectRefusal returns why a subject token may not call the route with
// r's path values, or "". The subject must equal the path's, byte for byte,
// after the mux has unescaped it (so "u4%32" is u42, and "u42%7Cx" or
// "u42%2Fx" are other subjects, which taskkey refuses anyway).
func subjectRefusal(g apptoken.Grant, acc subjectAccess, r *http.Request) string {
	if acc.action == "" {
		return "a subject token opens only its own subject's tasks: this route needs an operator token"
	}
	if !g.Allows(acc.action) {
		return fmt.Sprintf("this subject token does not allow %s (tasklease_actions)", acc.action)
	}
	if acc.inBody {
		return ""
	}
	if r.PathValue("subject") != g.Subject {
		return "this subject token opens only its own subject"
	}
	if sc := r.PathValue("scope"); sc != "" && !g.AllowsScope(sc) {
		return fmt.Sprintf("this subject token does not open scope %q (tasklease_scopes)", truncate(sc))
	}
	return ""
}

// foregroundRefusal checks a subject token against the foreground hook's
// body: its subject, and every scope it names (a token limited to some
// scopes must name them: "every foreground job" is more than it may do).
func foregroundRefusal(p principal, subject string, scopes []string) string {
	if p.role != roleSubject {
		return ""
	}
	if subject != p.grant.Subject {
		return "this subject token opens only its own subject"
	}
	if p.grant.Scopes != nil && len(scopes) == 0 {
		return "this subject token is limited to some scopes (tasklease_scopes): list them in scopes"
	}
	for _, sc := range scopes {
		if !slices.Contains(p.grant.Scopes, sc) && p.grant.Scopes != nil {
			return fmt.Sprintf("this subject token does not open scope %q (tasklease_scopes)", truncate(sc))
		}
	}
	return ""
}
