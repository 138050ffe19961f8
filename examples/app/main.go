// Command app is the seed's page in an end user's app, end to end
// (docs/example-app.md): a backend that "logs in" a user and mints that
// user's subject token, and a page that shows the user's course sync
// ("Syncing — started 14:03, stage pushing"), offers "Sync now", cancel
// and "Last sync failed — retry", talking to a tasklease runner directly.
//
// Run it next to a runner started with examples/app/runner.yaml and the
// same TASKLEASE_APP_SECRET:
//
//	TASKLEASE_APP_SECRET=... go run ./cmd/runner serve --config examples/app/runner.yaml
//	TASKLEASE_APP_SECRET=... go run ./examples/app
//
// It is an example: the login takes any user name without a password, and
// sessions live in memory. What a production app does instead is in
// docs/example-app.md.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// Defaults of the flags; they match examples/app/runner.yaml.
const (
	listenDefault = "127.0.0.1:3000"
	runnerDefault = "http://127.0.0.1:8080"
)

func main() {
	if err := run(context.Background(), os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "app:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("app", flag.ContinueOnError)
	listen := fs.String("listen", envOr("TASKLEASE_EXAMPLE_LISTEN", listenDefault), "address to serve the page on (env TASKLEASE_EXAMPLE_LISTEN)")
	runner := fs.String("runner", envOr("TASKLEASE_URL", runnerDefault), "the runner's URL as the browser reaches it (env TASKLEASE_URL)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	srv, err := newServer(config{
		Secret:    os.Getenv("TASKLEASE_APP_SECRET"),
		RunnerURL: *runner,
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The runner must list exactly this origin in http.allowedOrigins.
	fmt.Printf("examples/app: open http://%s/ in a browser (the runner: %s)\n", ln.Addr(), *runner)
	return serveUntil(ctx, ln, srv)
}

// serveUntil serves h on ln until ctx ends, then shuts down.
func serveUntil(ctx context.Context, ln net.Listener, h http.Handler) error {
	hs := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		return err
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
