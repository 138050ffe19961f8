// Package fence is the downstream half of tasklease's fencing (docs/fencing.md):
// a guard that accepts a write for task key K with fencing token T only if T
// is at least the highest token it has accepted for K, atomically with the
// write.
//
// A fencing token only protects data if the system receiving the write
// checks it. tasklease hands every stage its token (Run.FencingToken, the
// TASKLEASE_FENCING_TOKEN variable of exec stages, the Tasklease-Key and
// Tasklease-Fencing-Token headers of HTTP stages); a runner that lost its
// lease — paused, partitioned, or simply slow — may still be writing when
// the next holder, with a higher token, already wrote. This package refuses
// that late write:
//
//   - In PostgreSQL, CheckPgx and CheckSQL run one statement on the
//     tasklease_fences table inside the caller's transaction. The row stays
//     locked until the transaction ends, so the check and the caller's
//     write commit together or not at all; a stale token returns ErrStale
//     and the caller rolls back. MigratePgx (or MigrateSQL) creates the
//     table.
//   - Middleware guards an HTTP downstream: it reads the Tasklease-Key and
//     Tasklease-Fencing-Token headers and answers 409 to a stale token,
//     which a tasklease HTTP stage turns into a permanent stop. With
//     PostgresStore the handler's writes join the guard's transaction
//     (TxFromContext); with RedisStore the guard orders acceptances only.
//
// Equal tokens are accepted: one run (one grant) may write many times.
package fence

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ErrStale: a write carried a fencing token lower than one already accepted
// for its key; a newer holder has written. The writer must stop, not retry.
var ErrStale = errors.New("fence: stale fencing token")

// ErrBadInput: a key or token the guard cannot check (empty key, a token
// that is not a positive integer).
var ErrBadInput = errors.New("fence: bad key or token")

// Headers a tasklease HTTP stage sends (docs/stages.md).
const (
	// HeaderKey carries the run's task key, "<subject>|<scope>".
	HeaderKey = "Tasklease-Key"
	// HeaderToken carries the run's fencing token, a decimal integer.
	HeaderToken = "Tasklease-Fencing-Token"
)

// maxKeyLen bounds keys: a tasklease key is at most 128 + 1 + 64 bytes.
const maxKeyLen = 512

// validate checks a key and token before anything is written.
func validate(key string, token int64) error {
	if key == "" || len(key) > maxKeyLen || strings.ContainsRune(key, 0) {
		return fmt.Errorf("%w: key %q", ErrBadInput, key)
	}
	if token <= 0 {
		return fmt.Errorf("%w: token %d (want > 0)", ErrBadInput, token)
	}
	return nil
}

// ParseToken parses a fencing token as sent in the header or environment.
func ParseToken(s string) (int64, error) {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n <= 0 {
		return 0, fmt.Errorf("%w: token %q", ErrBadInput, s)
	}
	return n, nil
}
