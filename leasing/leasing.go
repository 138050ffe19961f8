// Package leasing grants, renews and releases leases on task keys, each with
// a fencing token, and keeps a held lease alive with a Keeper.
//
// A lease is the right to execute a task key's run. It is a Redis string
// "<token>|<owner>" with a PX expiry, so a crashed holder's lease always ends.
// Every grant advances the key's fence counter in the same Lua script
// (lua/lease_acquire.lua) to max(previous token + 1, Redis TIME in
// microseconds), so tokens are strictly increasing per key — also after Redis
// lost the counter (restart without persistence, failover to a lagging
// replica, a flush), as long as the new primary's clock is not behind by more
// than the time since the last grant — and a downstream system can reject a
// write carrying an older token. Tokens stay below 2^53 (JSON-safe). Renew and
// Release compare owner and token: a holder whose lease expired and was
// granted to someone else gets ErrNotHeld and changes nothing.
//
// Expiry is decided by Redis alone; runner clocks only ever decide to give up
// early (see Keeper).
//
//	m, _ := leasing.NewManager(rdb, leasing.Config{})
//	lease, err := m.Acquire(ctx, taskkey.MustNew("u42", "course_sync"), "pod-a", 15*time.Second)
//	var held *leasing.HeldError
//	if errors.As(err, &held) { /* someone else runs it: held.Owner, held.Remaining */ }
//	keeper, _ := m.Keep(ctx, lease, leasing.KeeperConfig{})
//	defer keeper.Stop()
//	doWork(keeper.Context(), lease.Token) // cancelled as soon as the lease may be lost
//	_ = m.Release(ctx, lease)
package leasing

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tasklease/tasklease/internal/keyspace"
	"github.com/tasklease/tasklease/internal/slotmap"
	"github.com/tasklease/tasklease/lua"
	"github.com/tasklease/tasklease/taskkey"
)

// Sentinel errors; test with errors.Is.
var (
	// ErrHeld: the lease is held by another owner (see HeldError).
	ErrHeld = errors.New("leasing: lease held by another owner")
	// ErrNotHeld: the caller's lease expired or was granted to someone else;
	// the write was refused.
	ErrNotHeld = errors.New("leasing: lease not held")
	// ErrLost: a Keeper gave the lease up (renewal refused or unconfirmed).
	ErrLost = errors.New("leasing: lease lost")
	// ErrConfig: invalid configuration or argument.
	ErrConfig = errors.New("leasing: invalid config")
)

// Limits of a lease.
const (
	// TTLMin is the shortest lease TTL Acquire accepts; a shorter one is
	// ErrConfig.
	TTLMin = 10 * time.Millisecond
	// OwnerMaxLen is the longest owner name Acquire accepts, in bytes; the
	// owner must also not be empty.
	OwnerMaxLen = 200
)

// HeldError is returned by Acquire when another owner holds the lease.
type HeldError struct {
	// Key is the task key Acquire asked for.
	Key taskkey.Key
	// Owner is the current holder, as it named itself when it acquired.
	Owner string
	// Token is the current holder's fencing token.
	Token     int64
	Remaining time.Duration // lease time left, per Redis
}

// Error implements error, naming the holder, its token and the time left.
func (e *HeldError) Error() string {
	return fmt.Sprintf("leasing: %s held by %s (token %d, %s left)", e.Key, e.Owner, e.Token, e.Remaining)
}

// Unwrap makes errors.Is(err, ErrHeld) true.
func (e *HeldError) Unwrap() error { return ErrHeld }

// Lease is a granted lease. It is a value: renewing does not change it.
type Lease struct {
	// Key is the task key the lease is on.
	Key taskkey.Key
	// Owner is the holder's name passed to Acquire; Renew and Release
	// compare it with the one stored in Redis.
	Owner string
	// Token is the fencing token: strictly greater than every earlier
	// grant's token for this key. Hand it to every side effect.
	Token int64
	// TTL is the lease's duration: granted for TTL, and each Renew extends
	// it to TTL from then (by Redis time).
	TTL time.Duration
	// GrantedAt is the runner-local time the grant request was sent: the
	// lease cannot end before GrantedAt+TTL by Redis time, so a Keeper
	// measures its deadline from here.
	GrantedAt time.Time
}

// Config places leases in Redis.
type Config struct {
	// Prefix of every key (default keyspace.PrefixDefault, "tasklease").
	Prefix string
	// Partitions of the keyspace (default 16). Fixed for a deployment's life:
	// changing it moves keys to other partitions.
	Partitions int
	// FenceTTL is how long a key's fence counter outlives its last grant
	// (default FenceTTLDefault). Tokens stay monotonic after it expired,
	// because a grant's token is never below Redis time in microseconds;
	// the counter only orders grants within one microsecond and across
	// small clock steps back.
	FenceTTL time.Duration
}

// FenceTTLDefault is Config.FenceTTL's default.
const FenceTTLDefault = 7 * 24 * time.Hour

// Manager grants and manages leases. Safe for concurrent use.
type Manager struct {
	rdb                     redis.UniversalClient
	ks                      *keyspace.Space
	fenceTTL                time.Duration
	acquire, renew, release *redis.Script
}

// NewManager validates cfg and returns a Manager on rdb, which may be a
// *redis.Client, *redis.ClusterClient or any redis.UniversalClient.
func NewManager(rdb redis.UniversalClient, cfg Config) (*Manager, error) {
	if rdb == nil {
		return nil, fmt.Errorf("%w: nil redis client", ErrConfig)
	}
	// A Cluster client must follow failovers (internal/slotmap).
	slotmap.Follow(rdb)
	ks, err := keyspace.New(cfg.Prefix, cfg.Partitions)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	if cfg.FenceTTL == 0 {
		cfg.FenceTTL = FenceTTLDefault
	}
	if cfg.FenceTTL < time.Millisecond {
		return nil, fmt.Errorf("%w: fence TTL %s below 1ms", ErrConfig, cfg.FenceTTL)
	}
	return &Manager{
		rdb:      rdb,
		ks:       ks,
		fenceTTL: cfg.FenceTTL,
		acquire:  lua.MustScript("lease_acquire"),
		renew:    lua.MustScript("lease_renew"),
		release:  lua.MustScript("lease_release"),
	}, nil
}

func validate(key taskkey.Key, owner string, ttl time.Duration) error {
	if key.IsZero() {
		return fmt.Errorf("%w: zero task key", ErrConfig)
	}
	if owner == "" || len(owner) > OwnerMaxLen {
		return fmt.Errorf("%w: owner must be 1..%d bytes", ErrConfig, OwnerMaxLen)
	}
	if ttl < TTLMin {
		return fmt.Errorf("%w: ttl %s below %s", ErrConfig, ttl, TTLMin)
	}
	return nil
}

// Acquire grants the lease on key to owner for ttl, in one round trip. When
// another owner holds it, the error is a *HeldError (errors.Is ErrHeld).
func (m *Manager) Acquire(ctx context.Context, key taskkey.Key, owner string, ttl time.Duration) (Lease, error) {
	if err := validate(key, owner, ttl); err != nil {
		return Lease{}, err
	}
	sent := time.Now()
	res, err := m.acquire.Run(ctx, m.rdb, []string{m.ks.Lease(key), m.ks.Fence(key)}, owner, ttl.Milliseconds(),
		max(m.fenceTTL, ttl).Milliseconds()).Slice()
	if err != nil {
		return Lease{}, fmt.Errorf("leasing: acquire %s: %w", key, err)
	}
	if len(res) >= 2 && res[0] == int64(1) {
		return Lease{Key: key, Owner: owner, Token: res[1].(int64), TTL: ttl, GrantedAt: sent}, nil
	}
	if len(res) != 3 {
		return Lease{}, fmt.Errorf("leasing: acquire %s: unexpected reply %v", key, res)
	}
	holder, _ := res[1].(string)
	pttl, _ := res[2].(int64)
	token, who := ParseValue(holder)
	return Lease{}, &HeldError{Key: key, Owner: who, Token: token, Remaining: time.Duration(pttl) * time.Millisecond}
}

// Renew extends the lease to lease.TTL from now (by Redis time) if owner and
// token still match; otherwise ErrNotHeld.
func (m *Manager) Renew(ctx context.Context, lease Lease) error {
	n, err := m.renew.Run(ctx, m.rdb, []string{m.ks.Lease(lease.Key)}, lease.Owner, lease.Token, lease.TTL.Milliseconds()).Int()
	if err != nil {
		return fmt.Errorf("leasing: renew %s: %w", lease.Key, err)
	}
	if n != 1 {
		return fmt.Errorf("leasing: renew %s token %d: %w", lease.Key, lease.Token, ErrNotHeld)
	}
	return nil
}

// Release ends the lease if owner and token still match; otherwise
// ErrNotHeld (the lease already expired or belongs to someone else).
func (m *Manager) Release(ctx context.Context, lease Lease) error {
	n, err := m.release.Run(ctx, m.rdb, []string{m.ks.Lease(lease.Key)}, lease.Owner, lease.Token).Int()
	if err != nil {
		return fmt.Errorf("leasing: release %s: %w", lease.Key, err)
	}
	if n != 1 {
		return fmt.Errorf("leasing: release %s token %d: %w", lease.Key, lease.Token, ErrNotHeld)
	}
	return nil
}

// Keep starts a Keeper that renews lease with Manager.Renew. cfg.TTL
// defaults to (and must equal) lease.TTL; cfg.Renew must be nil.
func (m *Manager) Keep(ctx context.Context, lease Lease, cfg KeeperConfig) (*Keeper, error) {
	switch {
	case cfg.TTL == 0:
		cfg.TTL = lease.TTL
	case cfg.TTL != lease.TTL:
		// Renew extends by lease.TTL; another keeper TTL would misplace the
		// give-up deadline.
		return nil, fmt.Errorf("%w: keeper TTL %s differs from the lease TTL %s", ErrConfig, cfg.TTL, lease.TTL)
	}
	if cfg.Renew != nil {
		return nil, fmt.Errorf("%w: Keep supplies Renew itself", ErrConfig)
	}
	cfg.Renew = func(ctx context.Context) error { return m.Renew(ctx, lease) }
	return NewKeeper(ctx, lease.GrantedAt, cfg)
}

// ParseValue splits a lease value "<token>|<owner>". A malformed value gives
// token 0 and the whole value as owner.
func ParseValue(v string) (token int64, owner string) {
	t, o, ok := strings.Cut(v, "|")
	if !ok {
		return 0, v
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil {
		return 0, v
	}
	return n, o
}
