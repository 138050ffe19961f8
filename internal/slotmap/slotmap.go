// Package slotmap keeps a go-redis ClusterClient's slot map current when a
// master fails over.
//
// go-redis (v9.23.0, osscluster.go) reloads its slot map only when a node
// answers MOVED, ASK or READONLY, or when a command finds the map older than
// ClusterStateReloadInterval (default one minute). A master that died
// answers nothing: ClusterClient.process retries the dial error on the same
// slot's master (MarkAsFailing only steers reads between replicas), and so
// do pipelines (processPipelineNode remaps failed commands with the same
// stale map). Every call to the dead master's slots then fails with
// "connection refused" — and pub/sub reconnects to it too, because it picks
// the slot's master from the same map — until that interval passes, even
// though the cluster promoted the replica seconds after the failure; a
// reload during the failure, before the promotion, loads the old map again
// and restarts the wait.
//
// Follow adds a hook that asks for a reload (ClusterClient.ReloadState:
// asynchronous, at most one per reloadEvery) whenever a call ends with an
// error that means the map may be wrong: any connection-level error (dial,
// reset, EOF, timeout) or a CLUSTERDOWN, TRYAGAIN, MASTERDOWN, READONLY,
// LOADING or MOVED reply. Calls keep failing until the map is right, so
// requests keep coming and the first reload after the promotion fixes it.
package slotmap

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// reloadEvery bounds how often a client's slot map is reloaded while calls
// fail: CLUSTER SLOTS is cheap, but every failing call of every goroutine
// would otherwise ask. go-redis adds its own 200 ms cooldown between
// back-to-back reloads.
const reloadEvery = 200 * time.Millisecond

// staleReplies start the error replies of a node that is not (or no
// longer) the one to ask, or of a cluster being reconfigured. ASK is not
// one: it is a slot migration in progress, which go-redis follows.
var staleReplies = []string{"CLUSTERDOWN ", "TRYAGAIN ", "MASTERDOWN ", "READONLY ", "LOADING ", "MOVED "}

// Follow makes rdb reload its slot map when calls fail in a way that means
// it may be stale (see the package doc). It does nothing unless rdb is a
// *redis.ClusterClient. Each call adds a hook: a client shared by several
// registries gets several, which only ask for reloads that go-redis merges.
func Follow(rdb redis.UniversalClient) {
	cc, ok := rdb.(*redis.ClusterClient)
	if !ok || cc == nil {
		return
	}
	cc.AddHook(&hook{reload: cc.ReloadState})
}

// hook asks for a slot map reload after calls that failed with Stale errors.
type hook struct {
	reload func(context.Context)
	last   atomic.Int64 // UnixNano of the last reload asked for
}

func (h *hook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *hook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err != nil && Stale(err) {
			h.maybeReload()
		}
		return err
	}
}

// ProcessPipelineHook looks at every command: a pipeline's error is its
// first command's, which may be a script's own error while a later
// command, on another node, met the dead master.
func (h *hook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if err != nil {
			for _, c := range cmds {
				if Stale(c.Err()) {
					h.maybeReload()
					break
				}
			}
		}
		return err
	}
}

func (h *hook) maybeReload() {
	now := time.Now().UnixNano()
	last := h.last.Load()
	if now-last < int64(reloadEvery) || !h.last.CompareAndSwap(last, now) {
		return
	}
	// ReloadState only starts a reload in the background (LazyReload),
	// so the failing call is not delayed.
	h.reload(context.Background())
}

// Stale reports whether err, from a call on a Redis Cluster, means the
// client's slot map may no longer match the cluster: the node did not
// answer (dial error, closed or reset connection, timeout), or answered
// that the cluster is down or reconfiguring or that the slot lives
// elsewhere. Replies about the command itself (script errors, WRONGTYPE,
// NOSCRIPT, redis.Nil …) and the caller's own cancel are not.
func Stale(err error) bool {
	switch {
	case err == nil, errors.Is(err, redis.Nil), errors.Is(err, context.Canceled), errors.Is(err, redis.ErrClosed):
		return false
	}
	var reply redis.Error
	if !errors.As(err, &reply) {
		return true // no reply: the node is unreachable or stopped answering
	}
	for _, prefix := range staleReplies {
		if strings.HasPrefix(reply.Error(), prefix) {
			return true
		}
	}
	return false
}
