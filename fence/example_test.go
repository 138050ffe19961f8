package fence_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"

	"github.com/alicebob/miniredis/v2"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/fence"
)

// The seed's story: a timer sync of u42 starts pushing (token 100), stalls
// (a GC pause, a slow network) and loses its lease; the "sync now" the user
// tapped meanwhile runs with token 101 and pushes the newer course list.
// When the stalled sync wakes and pushes its stale list, the remote store
// refuses it, and the HTTP stage stops that run instead of retrying.
func Example() {
	mr, _ := miniredis.Run()
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()

	// The remote store: keeps the last course list pushed per key.
	remote := map[string]string{}
	store := fence.Middleware(fence.RedisStore{Client: rdb}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		remote[r.Header.Get(fence.HeaderKey)] = string(b)
		w.WriteHeader(http.StatusNoContent)
	}))
	srv := httptest.NewServer(store)
	defer srv.Close()

	// What a tasklease HTTP stage sends: the key and the run's token.
	push := func(token int64, courses string) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(courses))
		req.Header.Set(fence.HeaderKey, "u42|course_sync")
		req.Header.Set(fence.HeaderToken, strconv.FormatInt(token, 10))
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			panic(err)
		}
		res.Body.Close()
		fmt.Printf("push with token %d (%s): %d\n", token, courses, res.StatusCode)
	}

	push(101, "math,physics,chemistry") // the "sync now" run
	push(100, "math,physics")           // the stalled timer run wakes up
	fmt.Println("remote has:", remote["u42|course_sync"])
	// Output:
	// push with token 101 (math,physics,chemistry): 204
	// push with token 100 (math,physics): 409
	// remote has: math,physics,chemistry
}

// A stage writing to PostgreSQL checks its token in the same transaction
// as its write: a stale run's write rolls back.
func ExampleCheckPgx() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://postgres@127.0.0.1:5432/test")
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := fence.MigratePgx(ctx, pool); err != nil { // once, at deploy
		panic(err)
	}
	key, token := "u42|course_sync", int64(1796166625419546) // run.Key(), run.FencingToken()
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := fence.CheckPgx(ctx, tx, key, token); err != nil {
			return err // fence.ErrStale: a newer run has written; nothing is changed
		}
		_, err := tx.Exec(ctx, `UPDATE courses SET list = $2 WHERE subject = $1`, "u42", "math,physics")
		return err
	})
	fmt.Println(err)
}
