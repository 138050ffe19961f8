// Command fencedemo is the seed's "remote store" as a fence-guarded HTTP
// downstream, for docker-compose.yml and trying tasklease by hand: it keeps
// the last body pushed per task key, and refuses (409) a push whose
// Tasklease-Fencing-Token is below one it accepted for that key — the stale
// overwrite the seed's article is about. Tokens are kept in Redis
// (fence.RedisStore), so every replica of the demo agrees.
//
//	fencedemo --listen 127.0.0.1:9000 --redis redis://127.0.0.1:6379/0
//	POST /push   (a tasklease HTTP stage's request)  → 204, or 409 stale_token
//	GET  /state  → {"<key>": {"token": …, "body": …}, …}
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/fence"
)

// pushed is what the store keeps per key.
type pushed struct {
	Token int64           `json:"token"`
	Body  json.RawMessage `json:"body"`
	At    time.Time       `json:"at"`
}

type remote struct {
	mu   sync.Mutex
	last map[string]pushed
	log  *slog.Logger
}

func (s *remote) push(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil || !json.Valid(b) {
		http.Error(w, "want a JSON body", http.StatusBadRequest)
		return
	}
	key := r.Header.Get(fence.HeaderKey)
	token, _ := fence.ParseToken(r.Header.Get(fence.HeaderToken)) // the middleware checked it
	s.mu.Lock()
	s.last[key] = pushed{Token: token, Body: b, At: time.Now().UTC()}
	s.mu.Unlock()
	s.log.Info("push accepted", slog.String("task_key", key), slog.Int64("fencing_token", token))
	w.WriteHeader(http.StatusNoContent)
}

func (s *remote) state(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(s.last)
}

// handler is the demo's routes: /push guarded by store, /state open.
func handler(store fence.Store, log *slog.Logger) http.Handler {
	s := &remote{last: map[string]pushed{}, log: log}
	mux := http.NewServeMux()
	mux.Handle("POST /push", fence.Middleware(store, http.HandlerFunc(s.push)))
	mux.HandleFunc("GET /state", s.state)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	return mux
}

func main() {
	listen := flag.String("listen", "127.0.0.1:9000", "listen address")
	redisURL := flag.String("redis", "redis://127.0.0.1:6379/0", "Redis URL for the accepted tokens")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	if err := run(*listen, *redisURL, log); err != nil {
		log.Error("fencedemo", slog.Any("error", err))
		os.Exit(1)
	}
}

func run(listen, redisURL string, log *slog.Logger) error {
	opts, err := redis.ParseURL(redisURL)
	if err != nil {
		return fmt.Errorf("--redis: %w", err)
	}
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	srv := &http.Server{Addr: listen, Handler: handler(fence.RedisStore{Client: rdb}, log), ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shut)
	}()
	log.Info("fencedemo listening", slog.String("listen", listen))
	if err := srv.ListenAndServe(); err != nil && err != http.ErrServerClosed {
		return err
	}
	return nil
}
