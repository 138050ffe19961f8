package fence

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
)

// errHandlerFailed makes a Store undo a guarded write whose handler
// answered an error status.
var errHandlerFailed = errors.New("fence: handler answered an error")

// Middleware guards an HTTP downstream of tasklease HTTP stages: every
// request must carry the Tasklease-Key and Tasklease-Fencing-Token headers
// (400 otherwise); a token below the highest accepted for its key is
// answered 409 stale_token — which the HTTP stage turns into a permanent
// stop of the run — and never reaches next. next runs inside store.Guard:
// with a PostgresStore its writes use TxFromContext(r.Context()) and commit
// with the raised token. The response is buffered until the guard has
// committed, so a client never sees 2xx for a write that was rolled back;
// an answer of 400 or more rolls the write back. Errors of the store are
// answered 503. Guard only routes that write.
func Middleware(store Store, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get(HeaderKey)
		token, err := ParseToken(r.Header.Get(HeaderToken))
		if key == "" || err != nil {
			writeError(w, http.StatusBadRequest, "bad_request", "want headers "+HeaderKey+" and "+HeaderToken+" (a positive integer)")
			return
		}
		rec := &buffered{header: http.Header{}, status: http.StatusOK}
		err = store.Guard(r.Context(), key, token, func(ctx context.Context) error {
			next.ServeHTTP(rec, r.WithContext(ctx))
			if rec.status >= 400 {
				return errHandlerFailed
			}
			return nil
		})
		switch {
		case err == nil, errors.Is(err, errHandlerFailed):
			rec.flushTo(w)
		case errors.Is(err, ErrStale):
			writeError(w, http.StatusConflict, "stale_token", err.Error())
		case errors.Is(err, ErrBadInput):
			writeError(w, http.StatusBadRequest, "bad_request", err.Error())
		default:
			slog.ErrorContext(r.Context(), "fence: store failed", slog.String("task_key", key), slog.Int64("fencing_token", token), slog.Any("error", err))
			writeError(w, http.StatusServiceUnavailable, "unavailable", "fence store unavailable")
		}
	})
}

// buffered is a ResponseWriter that keeps the response until the guard's
// outcome is known.
type buffered struct {
	header http.Header
	status int
	wrote  bool
	body   bytes.Buffer
}

func (b *buffered) Header() http.Header { return b.header }

func (b *buffered) WriteHeader(status int) {
	if !b.wrote {
		b.status, b.wrote = status, true
	}
}

func (b *buffered) Write(p []byte) (int, error) {
	b.wrote = true
	return b.body.Write(p)
}

func (b *buffered) flushTo(w http.ResponseWriter) {
	for k, v := range b.header {
		w.Header()[k] = v
	}
	w.WriteHeader(b.status)
	_, _ = w.Write(b.body.Bytes())
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": code, "message": msg}})
}
