package fence

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"
)

// Store is where a guard keeps the highest accepted token per key.
type Store interface {
	// Guard runs write if token is not below the highest accepted for key
	// (and records it), else returns ErrStale without running write. An
	// error from write undoes the acceptance where the store can (see each
	// store).
	Guard(ctx context.Context, key string, token int64, write func(ctx context.Context) error) error
}

// PgxBeginner starts transactions: *pgxpool.Pool and *pgx.Conn satisfy it.
type PgxBeginner interface {
	// Begin starts a transaction, as pgx does.
	Begin(ctx context.Context) (pgx.Tx, error)
}

// PostgresStore guards writes made in PostgreSQL: Guard begins a
// transaction, runs CheckPgx in it and hands it to write through the
// context (TxFromContext); write's changes and the raised token commit
// together, or roll back together when write fails or the token is stale.
type PostgresStore struct {
	// DB begins the transaction of each guarded write, e.g. a
	// *pgxpool.Pool. Its database needs the table MigratePgx creates.
	DB PgxBeginner
}

type txKey struct{}

// TxFromContext returns the transaction PostgresStore.Guard (and so
// Middleware with a PostgresStore) runs the guarded write in.
func TxFromContext(ctx context.Context) (pgx.Tx, bool) {
	tx, ok := ctx.Value(txKey{}).(pgx.Tx)
	return tx, ok
}

// Guard implements Store.
func (s PostgresStore) Guard(ctx context.Context, key string, token int64, write func(ctx context.Context) error) (err error) {
	if err := validate(key, token); err != nil {
		return err
	}
	tx, err := s.DB.Begin(ctx)
	if err != nil {
		return fmt.Errorf("fence: begin: %w", err)
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	if err := CheckPgx(ctx, tx, key, token); err != nil {
		return err
	}
	if err := write(context.WithValue(ctx, txKey{}, tx)); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("fence: commit: %w", err)
	}
	return nil
}

//go:embed accept.lua
var acceptLua string

var acceptScript = redis.NewScript(acceptLua)

// RedisStoreTTLDefault is how long RedisStore remembers a key's token after
// its last accepted write: tasklease's default retention, after which the
// runner's own record of the key is gone too.
const RedisStoreTTLDefault = 7 * 24 * time.Hour

// RedisStore keeps the highest accepted token per key in Redis (one string
// per key, "<Prefix>:fence:<key>", expiring TTL after the last acceptance;
// a negative TTL keeps them forever). It orders acceptances, not writes:
// write runs after the token was accepted, so a write that fails leaves the
// token raised, and two writes accepted in turn (token 5, then 7) may still
// land in the other order where they go. Use it for idempotent or
// last-writer-safe downstreams; use PostgresStore when the write is in
// PostgreSQL.
type RedisStore struct {
	// Client is the Redis that keeps the tokens.
	Client redis.UniversalClient
	// Prefix of the fence keys (default "tasklease-downstream").
	Prefix string
	// TTL (default RedisStoreTTLDefault; negative: no expiry).
	TTL time.Duration
}

// Guard implements Store.
func (s RedisStore) Guard(ctx context.Context, key string, token int64, write func(ctx context.Context) error) error {
	if err := validate(key, token); err != nil {
		return err
	}
	prefix, ttl := s.Prefix, s.TTL
	if prefix == "" {
		prefix = "tasklease-downstream"
	}
	switch {
	case ttl == 0:
		ttl = RedisStoreTTLDefault
	case ttl < 0:
		ttl = 0
	}
	ok, err := acceptScript.Run(ctx, s.Client, []string{prefix + ":fence:{" + key + "}"}, strconv.FormatInt(token, 10), ttl.Milliseconds()).Int()
	if err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("fence: redis: %w", err)
	}
	if ok != 1 {
		return fmt.Errorf("%w: key %s token %d", ErrStale, key, token)
	}
	return write(ctx)
}
