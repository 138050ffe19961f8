package fence

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Table is the table the PostgreSQL guard keeps the highest accepted token
// per key in. It lives in the connection's search_path.
const Table = "tasklease_fences"

// migrateSQL creates the table (idempotent).
const migrateSQL = `CREATE TABLE IF NOT EXISTS ` + Table + ` (
	key        text PRIMARY KEY,
	token      bigint NOT NULL CHECK (token > 0),
	updated_at timestamptz NOT NULL DEFAULT now()
)`

// checkSQL is the whole guard: insert the key, or raise its token, only if
// the new token is not below the stored one. ON CONFLICT takes the row lock
// and re-evaluates the WHERE against the row as committed by a concurrent
// writer, so of two racing transactions the lower token gets no row back —
// whichever commits first. The lock is held until the caller's transaction
// ends, so the caller's write commits with the check.
const checkSQL = `INSERT INTO ` + Table + ` AS f (key, token) VALUES ($1, $2)
ON CONFLICT (key) DO UPDATE SET token = excluded.token, updated_at = now()
	WHERE f.token <= excluded.token
RETURNING f.token`

// PgxQuerier runs the guard's statement: pgx.Tx, *pgx.Conn and
// *pgxpool.Pool / pgxpool.Tx satisfy it. Pass a transaction, the one your
// write runs in; on a bare connection or pool the check commits on its
// own and protects nothing.
type PgxQuerier interface {
	// QueryRow runs sql with args and returns its one row, as pgx does.
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// CheckPgx accepts token for key inside the caller's transaction, or
// returns ErrStale when a higher token was accepted (then roll back). Run
// it before the write it guards, in the same transaction, under READ
// COMMITTED (PostgreSQL's default); under REPEATABLE READ or SERIALIZABLE a
// concurrent raise of the same key fails with a serialization error
// instead, which the caller must retry.
func CheckPgx(ctx context.Context, q PgxQuerier, key string, token int64) error {
	if err := validate(key, token); err != nil {
		return err
	}
	var got int64
	err := q.QueryRow(ctx, checkSQL, key, token).Scan(&got)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("%w: key %s token %d", ErrStale, key, token)
	}
	if err != nil {
		return fmt.Errorf("fence: check %s: %w", key, err)
	}
	return nil
}

// SQLQuerier runs the guard's statement through database/sql: *sql.Tx
// satisfies it (and *sql.DB and *sql.Conn, which protect nothing: see
// PgxQuerier). Any PostgreSQL driver works, e.g. pgx's stdlib.
type SQLQuerier interface {
	// QueryRowContext runs query with args and returns its one row, as
	// database/sql does.
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// CheckSQL is CheckPgx for database/sql.
func CheckSQL(ctx context.Context, q SQLQuerier, key string, token int64) error {
	if err := validate(key, token); err != nil {
		return err
	}
	var got int64
	err := q.QueryRowContext(ctx, checkSQL, key, token).Scan(&got)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("%w: key %s token %d", ErrStale, key, token)
	}
	if err != nil {
		return fmt.Errorf("fence: check %s: %w", key, err)
	}
	return nil
}

// PgxExecer runs the migration: *pgx.Conn, *pgxpool.Pool, pgx.Tx.
type PgxExecer interface {
	// Exec runs sql with args, as pgx does.
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
}

// MigratePgx creates the guard's table if it does not exist.
func MigratePgx(ctx context.Context, db PgxExecer) error {
	if _, err := db.Exec(ctx, migrateSQL); err != nil {
		return fmt.Errorf("fence: migrate: %w", err)
	}
	return nil
}

// SQLExecer runs the migration through database/sql: *sql.DB, *sql.Tx.
type SQLExecer interface {
	// ExecContext runs query with args, as database/sql does.
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// MigrateSQL is MigratePgx for database/sql.
func MigrateSQL(ctx context.Context, db SQLExecer) error {
	if _, err := db.ExecContext(ctx, migrateSQL); err != nil {
		return fmt.Errorf("fence: migrate: %w", err)
	}
	return nil
}
