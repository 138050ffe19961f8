package main

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/fence"
)

func TestDemoRefusesTheStalePush(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	t.Cleanup(func() { rdb.Close() })
	srv := httptest.NewServer(handler(fence.RedisStore{Client: rdb}, slog.New(slog.DiscardHandler)))
	t.Cleanup(srv.Close)
	push := func(token, body string) int {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/push", strings.NewReader(body))
		req.Header.Set(fence.HeaderKey, "u42|course_sync")
		req.Header.Set(fence.HeaderToken, token)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	if c := push("101", `{"stage":"pushing","fencingToken":101}`); c != 204 {
		t.Fatalf("fresh push: %d", c)
	}
	if c := push("100", `{"stage":"pushing","fencingToken":100}`); c != 409 {
		t.Fatalf("stale push: %d, want 409", c)
	}
	res, err := http.Get(srv.URL + "/state")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var st map[string]pushed
	if err := json.NewDecoder(res.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	if st["u42|course_sync"].Token != 101 {
		t.Fatalf("state %+v, want the push of token 101", st)
	}
}
