package fence_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/jackc/pgx/v5"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx"
	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/fence"
	"github.com/tasklease/tasklease/internal/pgtest"
)

const key = "u42|course_sync"

func TestCheckPgxRefusesLowerTokens(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	if err := fence.MigratePgx(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if err := fence.MigratePgx(ctx, pool); err != nil {
		t.Fatalf("second migration: %v", err)
	}
	check := func(token int64) error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx)
		if err := fence.CheckPgx(ctx, tx, key, token); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	for _, tc := range []struct {
		token int64
		stale bool
	}{{10, false}, {10, false}, {12, false}, {11, true}, {1, true}, {13, false}} {
		err := check(tc.token)
		if tc.stale != errors.Is(err, fence.ErrStale) || (!tc.stale && err != nil) {
			t.Fatalf("token %d: %v (stale %v expected)", tc.token, err, tc.stale)
		}
	}
	// A rolled back check raises nothing.
	tx, _ := pool.Begin(ctx)
	if err := fence.CheckPgx(ctx, tx, key, 99); err != nil {
		t.Fatal(err)
	}
	_ = tx.Rollback(ctx)
	if err := check(14); err != nil {
		t.Fatalf("token 14 after a rolled-back 99: %v", err)
	}
	for _, bad := range []struct {
		key   string
		token int64
	}{{"", 5}, {key, 0}, {key, -3}} {
		if err := fence.CheckPgx(ctx, pool, bad.key, bad.token); !errors.Is(err, fence.ErrBadInput) {
			t.Errorf("CheckPgx(%q, %d) = %v, want ErrBadInput", bad.key, bad.token, err)
		}
	}
}

func TestCheckSQLRefusesLowerTokens(t *testing.T) {
	ctx := context.Background()
	db, err := sql.Open("pgx", pgtest.Schema(t))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := fence.MigrateSQL(ctx, db); err != nil {
		t.Fatal(err)
	}
	for i, tc := range []struct {
		token int64
		stale bool
	}{{5, false}, {7, false}, {6, true}, {7, false}} {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		err = fence.CheckSQL(ctx, tx, key, tc.token)
		if tc.stale != errors.Is(err, fence.ErrStale) || (!tc.stale && err != nil) {
			t.Fatalf("#%d token %d: %v", i, tc.token, err)
		}
		if err == nil {
			err = tx.Commit()
		} else {
			err = tx.Rollback()
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// 50 writers with interleaved tokens race to overwrite one document, each
// in a transaction guarded by CheckPgx. Whatever the interleaving: the
// stored document is the highest token's, and the writes that committed did
// so in token order (a lower token never lands after a higher one).
func TestFiftyConcurrentWritersKeepTheHighestToken(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	if err := fence.MigratePgx(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE docs (key text PRIMARY KEY, body text NOT NULL, token bigint NOT NULL);
		CREATE TABLE writes (id bigserial PRIMARY KEY, token bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	for round := range 5 {
		const writers = 50
		base := int64(round*1000 + 1000)
		tokens := rand.Perm(writers)
		var (
			wg           sync.WaitGroup
			mu           sync.Mutex
			stale, other int
		)
		start := make(chan struct{})
		for _, n := range tokens {
			token := base + int64(n)
			wg.Go(func() {
				<-start
				err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					if err := fence.CheckPgx(ctx, tx, key, token); err != nil {
						return err
					}
					if _, err := tx.Exec(ctx, `INSERT INTO docs VALUES ($1, $2, $3)
						ON CONFLICT (key) DO UPDATE SET body = excluded.body, token = excluded.token`, key, "pushed by "+strconv.FormatInt(token, 10), token); err != nil {
						return err
					}
					_, err := tx.Exec(ctx, `INSERT INTO writes (token) VALUES ($1)`, token)
					return err
				})
				mu.Lock()
				defer mu.Unlock()
				switch {
				case errors.Is(err, fence.ErrStale):
					stale++
				case err != nil:
					other++
					t.Errorf("writer %d: %v", token, err)
				}
			})
		}
		close(start)
		wg.Wait()
		top := base + writers - 1
		var body string
		var token int64
		if err := pool.QueryRow(ctx, `SELECT body, token FROM docs WHERE key = $1`, key).Scan(&body, &token); err != nil {
			t.Fatal(err)
		}
		if token != top || body != "pushed by "+strconv.FormatInt(top, 10) {
			t.Fatalf("round %d: stored %q (token %d), want the highest token's (%d)", round, body, token, top)
		}
		rows, err := pool.Query(ctx, `SELECT token FROM writes WHERE token >= $1 ORDER BY id`, base)
		if err != nil {
			t.Fatal(err)
		}
		committed, err := pgx.CollectRows(rows, pgx.RowTo[int64])
		if err != nil {
			t.Fatal(err)
		}
		for i := 1; i < len(committed); i++ {
			if committed[i] < committed[i-1] {
				t.Fatalf("round %d: token %d committed after %d: %v", round, committed[i], committed[i-1], committed)
			}
		}
		if len(committed)+stale != writers || other != 0 {
			t.Fatalf("round %d: %d committed + %d stale + %d errors, want %d", round, len(committed), stale, other, writers)
		}
		t.Logf("round %d: %d writes committed in token order, %d refused as stale", round, len(committed), stale)
	}
}

// guarded is a downstream that stores the body of each accepted push.
func guarded(t *testing.T, store fence.Store, write func(r *http.Request) error) *httptest.Server {
	t.Helper()
	h := fence.Middleware(store, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := write(r); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

func push(t *testing.T, url, key, token string) int {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, nil)
	if key != "" {
		req.Header.Set(fence.HeaderKey, key)
	}
	if token != "" {
		req.Header.Set(fence.HeaderToken, token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode
}

func TestMiddlewareWithPostgresStore(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	if err := fence.MigratePgx(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE pushes (token bigint NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	failNext := false
	srv := guarded(t, fence.PostgresStore{DB: pool}, func(r *http.Request) error {
		tx, ok := fence.TxFromContext(r.Context())
		if !ok {
			return errors.New("no transaction in the context")
		}
		tok, _ := fence.ParseToken(r.Header.Get(fence.HeaderToken))
		if _, err := tx.Exec(r.Context(), `INSERT INTO pushes VALUES ($1)`, tok); err != nil {
			return err
		}
		if failNext {
			return errors.New("downstream failed after writing")
		}
		return nil
	})
	for _, tc := range []struct {
		key, token string
		fail       bool
		want       int
	}{
		{key, "100", false, 204}, {key, "100", false, 204}, {key, "99", false, 409}, {key, "300", true, 500},
		{key, "200", false, 204}, {"", "5", false, 400}, {key, "x", false, 400}, {key, "", false, 400}, {key, "-1", false, 400},
	} {
		failNext = tc.fail
		if got := push(t, srv.URL, tc.key, tc.token); got != tc.want {
			t.Fatalf("push %q %q: %d, want %d", tc.key, tc.token, got, tc.want)
		}
	}
	// The failed 300 rolled back with its write: 200 was still accepted,
	// and only the accepted pushes were stored.
	rows, _ := pool.Query(ctx, `SELECT token FROM pushes ORDER BY token`)
	got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil || fmt.Sprint(got) != "[100 100 200]" {
		t.Fatalf("stored pushes %v %v, want [100 100 200]", got, err)
	}
}

func TestMiddlewareWithRedisStore(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	var mu sync.Mutex
	var stored []string
	srv := guarded(t, fence.RedisStore{Client: rdb}, func(r *http.Request) error {
		mu.Lock()
		defer mu.Unlock()
		stored = append(stored, r.Header.Get(fence.HeaderToken))
		return nil
	})
	for _, tc := range []struct {
		token string
		want  int
	}{{"1796000000000001", 204}, {"1796000000000003", 204}, {"1796000000000002", 409}, {"1796000000000003", 204}} {
		if got := push(t, srv.URL, key, tc.token); got != tc.want {
			t.Fatalf("push %s: %d, want %d", tc.token, got, tc.want)
		}
	}
	if fmt.Sprint(stored) != "[1796000000000001 1796000000000003 1796000000000003]" {
		t.Fatalf("stored %v", stored)
	}
	if ttl := mr.TTL("tasklease-downstream:fence:{" + key + "}"); ttl != fence.RedisStoreTTLDefault {
		t.Errorf("fence key TTL %s, want %s", ttl, fence.RedisStoreTTLDefault)
	}
}
