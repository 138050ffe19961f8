// Package apptoken verifies and mints subject tokens (DESIGN §12,
// docs/app-access.md): JWTs an end user's app holds, each naming one
// subject and opening only that subject's tasks.
//
// A token is verified with github.com/golang-jwt/jwt/v5. Algorithms are
// pinned per key: HS256 with Config.HMACSecret; the asymmetric algorithms
// (RS*, PS*, ES*, EdDSA) with a key of Config.JWKSURL, fetched and refreshed
// by github.com/MicahParks/keyfunc/v3, which also refuses a token whose alg
// differs from its key's own alg. An HS256 token is never checked against a
// JWKS key, so a token signed with a public key as an HMAC secret (RFC 8725
// §2.1) fails, as does alg "none". exp is required (exp 0 is 1970, long
// expired), nbf is honoured, with Leeway of clock skew; iss and aud are
// checked when configured.
package apptoken

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/MicahParks/keyfunc/v3"
	"github.com/golang-jwt/jwt/v5"

	"github.com/tasklease/tasklease/taskkey"
)

const (
	// Leeway is the clock skew allowed on exp and nbf (at most 30 s by
	// DESIGN §12).
	Leeway = 10 * time.Second
	// SubjectClaimDefault names the claim holding the subject.
	SubjectClaimDefault = "sub"
	// ClaimScopes lists the jobs (scopes) a token may touch; absent: all.
	ClaimScopes = "tasklease_scopes"
	// ClaimActions lists what a token may do (read, submit, cancel);
	// absent: all.
	ClaimActions = "tasklease_actions"
	// MaxLen bounds a token; longer ones are refused before parsing.
	MaxLen = 8 << 10
	// HMACSecretMin is the shortest HS256 secret accepted: the hash's size
	// (RFC 7518 §3.2).
	HMACSecretMin = 32
	// jwksHTTPTimeout bounds one fetch of the JWKS.
	jwksHTTPTimeout = 10 * time.Second
)

// Action is what a subject token may do.
type Action string

// The actions of ClaimActions.
const (
	ActionRead   Action = "read"
	ActionSubmit Action = "submit"
	ActionCancel Action = "cancel"
)

// Actions are every action, in order.
var Actions = []Action{ActionRead, ActionSubmit, ActionCancel}

// asymmetric are the algorithms accepted with a JWKS key.
var asymmetric = []string{"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}

// reservedClaims may not be the subject claim.
var reservedClaims = []string{"exp", "nbf", "iat", "iss", "aud", "jti", ClaimScopes, ClaimActions}

// Config configures a Verifier: HMACSecret, JWKSURL or both.
type Config struct {
	// HMACSecret verifies HS256 tokens (at least HMACSecretMin bytes).
	HMACSecret string
	// JWKSURL is an identity provider's JSON Web Key Set.
	JWKSURL string
	// Issuer and Audience, when set, must match iss and aud.
	Issuer, Audience string
	// SubjectClaim names the claim with the subject (default "sub").
	SubjectClaim string
	// HTTPClient fetches the JWKS (default: a client with a 10 s timeout).
	HTTPClient *http.Client
	// Logger receives JWKS refresh failures (default slog.Default()).
	Logger *slog.Logger
}

// Enabled reports whether c can verify anything.
func (c Config) Enabled() bool { return c.HMACSecret != "" || c.JWKSURL != "" }

// CheckSubjectClaim reports why name cannot be the subject claim.
func CheckSubjectClaim(name string) error {
	if name == "" {
		return errors.New("must not be empty (omit it for sub)")
	}
	if slices.Contains(reservedClaims, name) {
		return fmt.Errorf("%q is a claim with another meaning", name)
	}
	return nil
}

// Grant is what a verified token allows.
type Grant struct {
	// Subject is the one subject the token opens.
	Subject string
	// Scopes the token may touch; nil means every scope.
	Scopes []string
	// Actions the token may do; nil means every action.
	Actions []Action
	// Expires is the token's exp.
	Expires time.Time
}

// AllowsScope reports whether the grant covers scope.
func (g Grant) AllowsScope(scope string) bool {
	return g.Scopes == nil || slices.Contains(g.Scopes, scope)
}

// Allows reports whether the grant covers the action.
func (g Grant) Allows(a Action) bool {
	return g.Actions == nil || slices.Contains(g.Actions, a)
}

// Verifier checks subject tokens.
type Verifier struct {
	secret       []byte
	jwks         keyfunc.Keyfunc
	parser       *jwt.Parser
	subjectClaim string
}

// NewVerifier returns a Verifier for c. With a JWKSURL it starts a
// goroutine, ended with ctx, that refreshes the key set (hourly, and on an
// unknown kid at most every 5 minutes); the first fetch failing does not
// fail NewVerifier: tokens are refused until a fetch succeeds.
func NewVerifier(ctx context.Context, c Config) (*Verifier, error) {
	if !c.Enabled() {
		return nil, errors.New("apptoken: neither an HMAC secret nor a JWKS URL")
	}
	v := &Verifier{subjectClaim: c.SubjectClaim}
	if v.subjectClaim == "" {
		v.subjectClaim = SubjectClaimDefault
	}
	if err := CheckSubjectClaim(v.subjectClaim); err != nil {
		return nil, fmt.Errorf("apptoken: subject claim %w", err)
	}
	var methods []string
	if c.HMACSecret != "" {
		if len(c.HMACSecret) < HMACSecretMin {
			return nil, fmt.Errorf("apptoken: the HMAC secret must be at least %d bytes", HMACSecretMin)
		}
		v.secret = []byte(c.HMACSecret)
		methods = append(methods, jwt.SigningMethodHS256.Alg())
	}
	if c.JWKSURL != "" {
		client := c.HTTPClient
		if client == nil {
			client = &http.Client{Timeout: jwksHTTPTimeout}
		}
		log := c.Logger
		if log == nil {
			log = slog.Default()
		}
		k, err := keyfunc.NewDefaultOverrideCtx(ctx, []string{c.JWKSURL}, keyfunc.Override{
			Client:      client,
			HTTPTimeout: jwksHTTPTimeout,
			RefreshErrorHandlerFunc: func(u string) func(context.Context, error) {
				return func(ctx context.Context, err error) {
					log.LogAttrs(ctx, slog.LevelWarn, "subject tokens: fetching the JWKS failed",
						slog.String("url", u), slog.Any("error", err))
				}
			},
		})
		if err != nil {
			return nil, fmt.Errorf("apptoken: JWKS %s: %w", c.JWKSURL, err)
		}
		v.jwks = k
		methods = append(methods, asymmetric...)
	}
	opts := []jwt.ParserOption{jwt.WithValidMethods(methods), jwt.WithExpirationRequired(), jwt.WithLeeway(Leeway)}
	if c.Issuer != "" {
		opts = append(opts, jwt.WithIssuer(c.Issuer))
	}
	if c.Audience != "" {
		opts = append(opts, jwt.WithAudience(c.Audience))
	}
	v.parser = jwt.NewParser(opts...)
	return v, nil
}

// Refusal is why a token was refused, in words safe to show and log: it
// never holds the token or any part of it.
type Refusal struct{ Reason string }

func (e *Refusal) Error() string { return "subject token refused: " + e.Reason }

// Verify checks token and returns what it allows. Every error is a
// *Refusal.
func (v *Verifier) Verify(token string) (Grant, error) {
	if len(token) > MaxLen {
		return Grant{}, &Refusal{Reason: fmt.Sprintf("longer than %d bytes", MaxLen)}
	}
	c := &claims{subjectClaim: v.subjectClaim}
	if _, err := v.parser.ParseWithClaims(token, c, v.key); err != nil {
		return Grant{}, &Refusal{Reason: reason(err)}
	}
	if c.subject == "" {
		return Grant{}, &Refusal{Reason: fmt.Sprintf("no subject in claim %q", v.subjectClaim)}
	}
	if err := taskkey.ValidateSubject(c.subject); err != nil {
		return Grant{}, &Refusal{Reason: fmt.Sprintf("claim %q is not a valid subject", v.subjectClaim)}
	}
	g := Grant{Subject: c.subject, Scopes: c.Scopes, Expires: c.ExpiresAt.Time}
	if c.Actions != nil {
		g.Actions = []Action{}
		for _, a := range c.Actions {
			// Unknown actions grant nothing.
			if slices.Contains(Actions, Action(a)) {
				g.Actions = append(g.Actions, Action(a))
			}
		}
	}
	return g, nil
}

// key is the jwt.Keyfunc: the key of the token's algorithm, never another
// kind (jwt.WithValidMethods has already refused an unlisted alg).
func (v *Verifier) key(t *jwt.Token) (any, error) {
	switch alg := t.Method.Alg(); {
	case alg == jwt.SigningMethodHS256.Alg() && v.secret != nil:
		return v.secret, nil
	case slices.Contains(asymmetric, alg) && v.jwks != nil:
		return v.jwks.Keyfunc(t)
	default:
		return nil, errNoKey
	}
}

var errNoKey = errors.New("no key for the token's algorithm")

// reason turns a parse error into a fixed phrase: jwt's and keyfunc's
// messages may quote decoded parts of the token.
func reason(err error) string {
	switch {
	case errors.Is(err, jwt.ErrTokenMalformed):
		return "malformed"
	case errors.Is(err, jwt.ErrTokenRequiredClaimMissing):
		// jwt says "<name> claim is required"; name one of ours only.
		for _, c := range []string{"exp", "aud", "iss"} {
			if strings.Contains(err.Error(), c+" claim is required") {
				return c + " missing"
			}
		}
		return "a required claim is missing"
	case errors.Is(err, jwt.ErrTokenExpired):
		return "expired"
	case errors.Is(err, jwt.ErrTokenNotValidYet):
		return "not valid yet (nbf)"
	case errors.Is(err, jwt.ErrTokenInvalidAudience):
		return "wrong audience"
	case errors.Is(err, jwt.ErrTokenInvalidIssuer):
		return "wrong issuer"
	case errors.Is(err, jwt.ErrTokenSignatureInvalid), errors.Is(err, jwt.ErrTokenUnverifiable):
		return "bad signature or algorithm"
	case errors.Is(err, jwt.ErrTokenInvalidClaims):
		return "invalid claims"
	}
	return "invalid"
}

// claims are the registered claims plus tasklease's. UnmarshalJSON also
// reads a subject claim other than sub.
type claims struct {
	jwt.RegisteredClaims
	Scopes  []string `json:"tasklease_scopes"`
	Actions []string `json:"tasklease_actions"`

	subjectClaim string
	subject      string
}

func (c *claims) UnmarshalJSON(b []byte) error {
	type plain struct {
		jwt.RegisteredClaims
		Scopes  []string `json:"tasklease_scopes"`
		Actions []string `json:"tasklease_actions"`
	}
	var p plain
	if err := json.Unmarshal(b, &p); err != nil {
		return err
	}
	c.RegisteredClaims, c.Scopes, c.Actions = p.RegisteredClaims, p.Scopes, p.Actions
	c.subject = c.Subject
	if c.subjectClaim != SubjectClaimDefault {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(b, &m); err != nil {
			return err
		}
		c.subject = ""
		if raw, ok := m[c.subjectClaim]; ok {
			if err := json.Unmarshal(raw, &c.subject); err != nil {
				return errors.New("subject claim is not a string")
			}
		}
	}
	return nil
}

// MintOptions describe a token Mint signs.
type MintOptions struct {
	Subject string
	TTL     time.Duration
	// Scopes and Actions, when not nil, become tasklease_scopes and
	// tasklease_actions.
	Scopes  []string
	Actions []string
	// Issuer and Audience, when set, become iss and aud (a string).
	Issuer, Audience string
	// SubjectClaim (default sub) holds Subject.
	SubjectClaim string
	// Now is the issue time (default time.Now()).
	Now time.Time
}

// Mint signs an HS256 token with secret:
//
//	header {"alg":"HS256","typ":"JWT"}
//	claims {"sub":..., "iat":..., "exp":..., ["iss"], ["aud"], ["tasklease_scopes"], ["tasklease_actions"]}
//
// iat and exp are integer seconds since 1970 (UTC).
func Mint(secret string, o MintOptions) (string, error) {
	if len(secret) < HMACSecretMin {
		return "", fmt.Errorf("the HMAC secret must be at least %d bytes", HMACSecretMin)
	}
	if err := taskkey.ValidateSubject(o.Subject); err != nil {
		return "", err
	}
	if o.TTL <= 0 {
		return "", errors.New("the TTL must be positive")
	}
	for _, s := range o.Scopes {
		if err := taskkey.ValidateScope(s); err != nil {
			return "", err
		}
	}
	for _, a := range o.Actions {
		if !slices.Contains(Actions, Action(a)) {
			return "", fmt.Errorf("unknown action %q (want read, submit or cancel)", a)
		}
	}
	now := o.Now
	if now.IsZero() {
		now = time.Now()
	}
	claim := o.SubjectClaim
	if claim == "" {
		claim = SubjectClaimDefault
	}
	if err := CheckSubjectClaim(claim); err != nil {
		return "", fmt.Errorf("subject claim %w", err)
	}
	m := jwt.MapClaims{
		claim: o.Subject,
		"iat": now.Unix(),
		"exp": now.Add(o.TTL).Unix(),
	}
	if o.Issuer != "" {
		m["iss"] = o.Issuer
	}
	if o.Audience != "" {
		m["aud"] = o.Audience
	}
	if o.Scopes != nil {
		m[ClaimScopes] = o.Scopes
	}
	if o.Actions != nil {
		m[ClaimActions] = o.Actions
	}
	return jwt.NewWithClaims(jwt.SigningMethodHS256, m).SignedString([]byte(secret))
}

// SplitList splits a comma-separated flag value ("a,b"), trimming spaces;
// "" is nil.
func SplitList(s string) []string {
	if strings.TrimSpace(s) == "" {
		return nil
	}
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}
