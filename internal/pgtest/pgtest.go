// Package pgtest gives tests a private PostgreSQL schema on the server at
// TASKLEASE_POSTGRES_URL (default postgres://postgres@127.0.0.1:5432/test).
// Without a reachable server a test skips — unless
// TASKLEASE_REQUIRE_POSTGRES=1 (set by .ci/run), which makes it a failure.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

const (
	urlEnv     = "TASKLEASE_POSTGRES_URL"
	requireEnv = "TASKLEASE_REQUIRE_POSTGRES"
	defaultURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
)

// URL is the server tests use.
func URL() string {
	if u := os.Getenv(urlEnv); u != "" {
		return u
	}
	return defaultURL
}

// Schema creates a fresh schema, dropped when the test ends, and returns
// a connection string whose search_path is that schema, so every table a
// test creates is its own.
func Schema(t testing.TB) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, URL())
	if err != nil {
		if os.Getenv(requireEnv) == "1" {
			t.Fatalf("pgtest: PostgreSQL at %s unreachable and %s=1: %v", URL(), requireEnv, err)
		}
		t.Skipf("pgtest: no PostgreSQL at %s (%v); set %s to another server", URL(), err, urlEnv)
	}
	defer conn.Close(context.Background())
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema := "tl_test_" + hex.EncodeToString(b)
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("pgtest: create schema: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, URL())
		if err != nil {
			t.Logf("pgtest: drop schema %s: %v", schema, err)
			return
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(ctx, "DROP SCHEMA "+schema+" CASCADE"); err != nil {
			t.Logf("pgtest: drop schema %s: %v", schema, err)
		}
	})
	u, err := url.Parse(URL())
	if err != nil {
		t.Fatalf("pgtest: %s: %v", urlEnv, err)
	}
	q := u.Query()
	q.Set("search_path", schema) // a runtime parameter of every connection
	u.RawQuery = q.Encode()
	return u.String()
}

// Pool opens a pgx pool on a fresh schema (see Schema), closed when the
// test ends.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), Schema(t))
	if err != nil {
		t.Fatalf("pgtest: pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}
