package main

import (
	"crypto/rand"
	"embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/tasklease/tasklease/internal/apptoken"
)

// The example's job, and the only one its tokens open.
const scope = "course_sync"

// tokenTTL is a subject token's life: short, since a JWT cannot be revoked
// (a user who logs out keeps a copied token until it expires). The page
// asks for a new one when the runner answers 401 or its stream ends.
const tokenTTL = 15 * time.Minute

// tokenActions are what the page may do: view, sync now, cancel.
var tokenActions = []string{string(apptoken.ActionRead), string(apptoken.ActionSubmit), string(apptoken.ActionCancel)}

// sessionCookie names the session. It is HttpOnly (the page's script never
// sees it) and SameSite=Strict (no other site's page sends it).
const sessionCookie = "app_session"

// web holds the page: index.html, style.css and app.js, the bundle esbuild
// builds from src/ (committed, so `go run ./examples/app` needs no Node;
// TestBundleIsBuiltFromSource checks it matches src/).
//
//go:embed web/index.html web/style.css web/app.js
var web embed.FS

type config struct {
	// Secret is the runner's http.subjectTokens.hmacSecret.
	Secret string
	// RunnerURL is where the page reaches the runner.
	RunnerURL string
}

// server is the example's backend: the page, a login that trusts any user
// name, and GET /token. Sessions are kept in memory.
type server struct {
	cfg          config
	runnerOrigin string
	mux          *http.ServeMux
	now          func() time.Time

	mu       sync.Mutex
	sessions map[string]string // session id → user (the subject)
}

func newServer(cfg config) (*server, error) {
	if len(cfg.Secret) < apptoken.HMACSecretMin {
		return nil, fmt.Errorf("TASKLEASE_APP_SECRET must be set to the runner's http.subjectTokens.hmacSecret (at least %d bytes)", apptoken.HMACSecretMin)
	}
	u, err := url.Parse(cfg.RunnerURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("the runner's URL %q is not an http(s) URL", cfg.RunnerURL)
	}
	cfg.RunnerURL = strings.TrimSuffix(cfg.RunnerURL, "/")
	s := &server{cfg: cfg, runnerOrigin: u.Scheme + "://" + u.Host, mux: http.NewServeMux(), now: time.Now, sessions: map[string]string{}}
	static, err := fs.Sub(web, "web")
	if err != nil {
		return nil, err
	}
	s.mux.HandleFunc("GET /{$}", s.page)
	s.mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	s.mux.HandleFunc("GET /session", s.session)
	s.mux.HandleFunc("POST /login", s.login)
	s.mux.HandleFunc("POST /logout", s.logout)
	s.mux.HandleFunc("GET /token", s.token)
	return s, nil
}

func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	// The page may load its own files and call the runner, nothing else:
	// no CDN, no fonts, no other host.
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self' "+s.runnerOrigin+
		"; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	s.mux.ServeHTTP(w, r)
}

func (s *server) page(w http.ResponseWriter, r *http.Request) {
	b, err := web.ReadFile("web/index.html")
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	_, _ = w.Write(b)
}

// user returns the logged-in user of r, or "".
func (s *server) user(r *http.Request) string {
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return ""
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sessions[c.Value]
}

// session answers who is logged in and where the runner is:
// {"user": "u42", "runnerUrl": "http://127.0.0.1:8080"}, or 401.
func (s *server) session(w http.ResponseWriter, r *http.Request) {
	u := s.user(r)
	if u == "" {
		writeError(w, http.StatusUnauthorized, "not logged in")
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"user": u, "runnerUrl": s.cfg.RunnerURL})
}

// login "logs in" body {"user": "u42"}: any user name that is a valid
// subject, no password. A real app checks credentials here. The body must
// be JSON, which another site's page cannot send without a CORS preflight
// this server never answers (no login CSRF). A session the browser already
// had is ended: switching account never leaves the old one usable.
func (s *server) login(w http.ResponseWriter, r *http.Request) {
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/json" {
		writeError(w, http.StatusUnsupportedMediaType, "send the user as JSON")
		return
	}
	var body struct {
		User string `json:"user"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 4<<10)).Decode(&body); err != nil {
		writeError(w, http.StatusBadRequest, "send {\"user\": NAME}")
		return
	}
	// Minting checks that the name is a subject the runner accepts.
	if _, err := s.mint(body.User, s.now()); err != nil {
		writeError(w, http.StatusBadRequest, "not a valid user name: "+err.Error())
		return
	}
	id := make([]byte, 32)
	_, _ = rand.Read(id) // never fails (crypto/rand)
	sid := base64.RawURLEncoding.EncodeToString(id)
	s.mu.Lock()
	if c, err := r.Cookie(sessionCookie); err == nil {
		delete(s.sessions, c.Value)
	}
	s.sessions[sid] = body.User
	s.mu.Unlock()
	http.SetCookie(w, &http.Cookie{
		Name: sessionCookie, Value: sid, Path: "/",
		// Over HTTPS a real app adds Secure (and the __Host- prefix).
		HttpOnly: true, SameSite: http.SameSiteStrictMode,
	})
	writeJSON(w, http.StatusOK, map[string]string{"user": body.User, "runnerUrl": s.cfg.RunnerURL})
}

// logout ends the session. Tokens already minted stay valid until they
// expire (at most tokenTTL): the page drops its own.
func (s *server) logout(w http.ResponseWriter, r *http.Request) {
	if c, err := r.Cookie(sessionCookie); err == nil {
		s.mu.Lock()
		delete(s.sessions, c.Value)
		s.mu.Unlock()
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	w.WriteHeader(http.StatusNoContent)
}

// token mints the logged-in user's subject token:
// {"token": "eyJ…", "subject": "u42", "expiresAt": "2026-…Z"}. The page
// sends it to the runner in the Authorization header only.
func (s *server) token(w http.ResponseWriter, r *http.Request) {
	u := s.user(r)
	if u == "" {
		writeError(w, http.StatusUnauthorized, "not logged in")
		return
	}
	now := s.now()
	tok, err := s.mint(u, now)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, map[string]string{
		"token": tok, "subject": u, "expiresAt": now.Add(tokenTTL).UTC().Format(time.RFC3339),
	})
}

// mint signs user's token: subject user, this example's job only, from
// now for tokenTTL.
func (s *server) mint(user string, now time.Time) (string, error) {
	if user == "" {
		return "", errors.New("empty")
	}
	return apptoken.Mint(s.cfg.Secret, apptoken.MintOptions{
		Subject: user,
		TTL:     tokenTTL,
		Scopes:  []string{scope},
		Actions: tokenActions,
		Now:     now,
	})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, map[string]string{"error": msg})
}
