package slotmap

import (
	"context"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/redis/go-redis/v9"
)

// reply is a Redis error reply, as go-redis returns one.
type reply string

func (r reply) Error() string { return string(r) }
func (reply) RedisError()     {}

func TestStale(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	for _, c := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{redis.Nil, false},
		{context.Canceled, false},
		{fmt.Errorf("jobs: get: %w", context.Canceled), false},
		{redis.ErrClosed, false},
		{reply("ERR Error running script"), false},
		{reply("WRONGTYPE Operation against a key holding the wrong kind of value"), false},
		{reply("NOSCRIPT No matching script"), false},
		{reply("ASK 3999 127.0.0.1:7001"), false}, // a migration in progress, not a new map

		{refused, true},
		{fmt.Errorf("jobs: get: %w", refused), true},
		{io.EOF, true},
		{&net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, true},
		{context.DeadlineExceeded, true},
		{reply("CLUSTERDOWN The cluster is down"), true},
		{fmt.Errorf("jobs: get: %w", reply("CLUSTERDOWN The cluster is down")), true},
		{reply("TRYAGAIN Multiple keys request during rehashing of slot"), true},
		{reply("MASTERDOWN Link with MASTER is down"), true},
		{reply("READONLY You can't write against a read only replica."), true},
		{reply("LOADING Redis is loading the dataset in memory"), true},
		{reply("MOVED 3999 127.0.0.1:7001"), true},
	} {
		if got := Stale(c.err); got != c.want {
			t.Errorf("Stale(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
