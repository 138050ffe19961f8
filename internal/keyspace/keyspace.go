// Package keyspace names every Redis key tasklease uses.
//
// All keys of one task live under the hash tag of its partition,
// "{<prefix>:p<N>}", with N = crc32(taskKey) % partitions (docs/concepts.md). A
// Lua script only ever touches keys of one partition, so every script is
// Redis Cluster safe, and the partition's request queues, retry queue and
// index share the slot of the tasks they reference.
package keyspace

import (
	"errors"
	"fmt"
	"hash/crc32"
	"regexp"
	"strconv"
	"sync"

	"github.com/tasklease/tasklease/taskkey"
)

// Defaults of a keyspace.
const (
	PrefixDefault     = "tasklease"
	PartitionsDefault = 16
	// PartitionsMax bounds the number of partitions; every runner reads every
	// partition's queues, so thousands would only add idle reads.
	PartitionsMax = 1024
)

var prefixRE = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]{0,63}$`) })

// ErrConfig is wrapped by construction errors.
var ErrConfig = errors.New("keyspace: invalid config")

// Space derives key names from a prefix and a partition count. It is
// immutable and safe for concurrent use.
type Space struct {
	prefix     string
	partitions int
	tags       []string
	tagIndex   map[string]int // Tag's inverse
	// per partition, the names built once (they are on every script call)
	requests, people, retry, index, events, cancels, watch []string
	queues                                                 [][]string // QueueKeys
}

// New validates prefix and partitions; empty prefix and zero partitions take
// the defaults.
func New(prefix string, partitions int) (*Space, error) {
	if prefix == "" {
		prefix = PrefixDefault
	}
	if partitions == 0 {
		partitions = PartitionsDefault
	}
	if !prefixRE().MatchString(prefix) {
		return nil, fmt.Errorf("%w: prefix %q must match %s", ErrConfig, prefix, prefixRE())
	}
	if partitions < 1 || partitions > PartitionsMax {
		return nil, fmt.Errorf("%w: partitions %d must be in 1..%d", ErrConfig, partitions, PartitionsMax)
	}
	s := &Space{prefix: prefix, partitions: partitions, tags: make([]string, partitions)}
	names := map[*[]string]string{&s.requests: ":requests", &s.people: ":requests:people", &s.retry: ":retry",
		&s.index: ":index", &s.events: ":events", &s.cancels: ":cancels", &s.watch: ":watch"}
	for list := range names {
		*list = make([]string, partitions)
	}
	s.queues = make([][]string, partitions)
	s.tagIndex = make(map[string]int, partitions)
	for p := range s.tags {
		s.tags[p] = "{" + prefix + ":p" + strconv.Itoa(p) + "}"
		for list, suffix := range names {
			(*list)[p] = s.tags[p] + suffix
		}
		t := s.tags[p]
		s.tagIndex[t] = p
		s.queues[p] = []string{t + ":q:b", t + ":q:p", t + ":bell", t + ":taken"}
	}
	return s, nil
}

// Prefix returns the key prefix.
func (s *Space) Prefix() string { return s.prefix }

// Partitions returns the partition count.
func (s *Space) Partitions() int { return s.partitions }

// Partition returns the partition of a task key.
func (s *Space) Partition(k taskkey.Key) int {
	return int(crc32String(k.String()) % uint32(s.partitions))
}

// crc32String is crc32.ChecksumIEEE of s without copying s to a []byte
// (a Partition on every call of the hot path).
func crc32String(s string) uint32 {
	crc := ^uint32(0)
	for i := 0; i < len(s); i++ {
		crc = crc32.IEEETable[byte(crc)^s[i]] ^ (crc >> 8)
	}
	return ^crc
}

// Tag returns the hash tag of partition p, "{prefix:pN}".
func (s *Space) Tag(p int) string { return s.tags[p] }

func (s *Space) taskKey(kind string, k taskkey.Key) string {
	return s.tags[s.Partition(k)] + ":" + kind + ":" + k.String()
}

// Lease is the key's lease: a string "<token>|<owner>" with a PX expiry.
func (s *Space) Lease(k taskkey.Key) string { return s.taskKey("lease", k) }

// Fence is the key's fencing counter: the last token granted. It expires
// with the record it fences; tokens stay monotonic without it because a
// grant's token is never below Redis time in microseconds.
func (s *Space) Fence(k taskkey.Key) string { return s.taskKey("fence", k) }

// Task is the key's run record and checkpoint (a hash).
func (s *Space) Task(k taskkey.Key) string { return s.taskKey("task", k) }

// History is the key's capped history: a list of compact events (see
// lua/lib/history.lua hist_ev), oldest first.
func (s *Space) History(k taskkey.Key) string { return s.taskKey("history", k) }

// LegacyHistory is where deployments before compact history kept a key's
// history (a stream); read only while such a key still exists.
func (s *Space) LegacyHistory(k taskkey.Key) string { return s.taskKey("hist", k) }

// Lane is a request queue of a partition. Requests from people (manual,
// foreground) go to the people lane, which runners read first; bulk work
// (schedule, retry) to the bulk lane.
type Lane int

// Lanes of a partition.
const (
	LanePeople Lane = iota
	LaneBulk
)

// Lanes returns the lanes in the order runners prefer them.
func Lanes() [2]Lane { return [2]Lane{LanePeople, LaneBulk} }

// Letter is the lane's name in run records, entries and scripts ("p" or "b").
func (l Lane) Letter() string {
	if l == LanePeople {
		return "p"
	}
	return "b"
}

// QueueKeys are partition p's request queue keys, in the order every script
// takes them (lib/queues.lua queue_at): the bulk lane's list, the people lane's
// list, the bell (a list holding at most one token, rung when a lane gets
// work: idle runners block on it) and the taken set (a sorted set of the
// entries runners took from the lanes, scored by the Redis time in ms at
// which they become reclaimable). The slice is shared: do not modify it.
func (s *Space) QueueKeys(p int) []string { return s.queues[p] }

// Queue is lane l's request list of partition p.
func (s *Space) Queue(p int, l Lane) string {
	if l == LanePeople {
		return s.queues[p][1]
	}
	return s.queues[p][0]
}

// Bell is partition p's wake-up list (see QueueKeys).
func (s *Space) Bell(p int) string { return s.queues[p][2] }

// Taken is partition p's sorted set of taken entries (see QueueKeys).
func (s *Space) Taken(p int) string { return s.queues[p][3] }

// LegacyStream is lane l's request stream of partition p, where versions
// before request lists queued requests (read by consumer group
// LegacyGroup). Runners of this version only drain it into the lists, so
// requests of older runners in a rolling deploy are still served.
func (s *Space) LegacyStream(p int, l Lane) string {
	if l == LanePeople {
		return s.people[p]
	}
	return s.requests[p]
}

// Retry is partition p's retry queue: a sorted set of task keys by due time.
func (s *Space) Retry(p int) string { return s.retry[p] }

// Index is partition p's task index: a sorted set of task keys by last update.
func (s *Space) Index(p int) string { return s.index[p] }

// Subjects is partition p's sorted set of the subjects requested for scope
// (by anything but a schedule), scored by the last such request's Redis
// time in ms: what "subjects: all" fans out to. Members older than the
// retention are pruned.
func (s *Space) Subjects(p int, scope string) string { return s.tags[p] + ":subjects-seen:" + scope }

// Paused is partition p's set of paused scopes. Every partition keeps its
// own copy so the claim script can honour a pause atomically (one hash tag);
// pausing writes all of them, partition 0 last, so a scope shown paused
// (read from partition 0) is paused everywhere.
func (s *Space) Paused(p int) string { return s.tags[p] + ":paused" }

// Parked is partition p's sorted set of runs parked by a paused scope
// (members "<scope> <subject>", all scored 0 so a scope's runs are one
// lexicographic range), re-queued on resume.
func (s *Space) Parked(p int) string { return s.tags[p] + ":parked" }

// Runners is the hash of runner presence records (owner → JSON), under its
// own hash tag: it belongs to no partition.
func (s *Space) Runners() string { return "{" + s.prefix + ":runners}" }

// Nudge is runner owner's nudge list: one token pushed to end its node
// wait early (jobs.nodeWaiter), when a partition went idle after the wait
// was sent or the runner stops. It expires a minute after a push, so a
// runner that died leaves nothing behind.
func (s *Space) Nudge(owner string) string { return s.prefix + ":nudge:" + owner }

// PartitionOfTag is the partition whose hash tag is tag (Tag's inverse).
func (s *Space) PartitionOfTag(tag string) (int, bool) {
	p, ok := s.tagIndex[tag]
	return p, ok
}

// Due is the due index of a single Redis server or Sentinel (not used on a
// Cluster, where it would be in another slot than the partitions'): a
// sorted set with a member per partition that has something coming due —
// "t" + its tag for its taken set (a lease to reclaim, a delayed run),
// "r" + its tag for its retries — scored no later than the earliest of
// them (Redis time, ms). It is also the channel on which the scripts wake
// the runners' timers (lua/lib/queues.lua mark_due, jobs.Runner's timer).
func (s *Space) Due() string { return s.prefix + ":due" }

// JanitorTurn is the key a runner sets (SET NX, expiring with the janitor's
// interval) to take the fleet's janitor pass: one pass per interval for the
// whole fleet, not one a runner.
func (s *Space) JanitorTurn() string { return s.prefix + ":janitor" }

// RunnerBeats is the sorted set of runners' last heartbeats (owner → Redis
// time in ms), in Runners' slot.
func (s *Space) RunnerBeats() string { return "{" + s.prefix + ":runners}:beats" }

// TokenFloor is the highest fencing token any runner reported on its
// presence beat (a string; it expires with the runner registry): runners
// raise their own floor to it (jobs/tokenfloor.go).
func (s *Space) TokenFloor() string { return "{" + s.prefix + ":runners}:floor" }

// Links is the list of W3C trace contexts of the requests that started or
// joined run runID of k (written only when tracing is on; expires with the
// retention).
func (s *Space) Links(k taskkey.Key, runID string) string {
	return s.taskKey("links", k) + "|" + runID
}

// FollowUpLinks is the list of W3C trace contexts of the requests merged
// into k's next run (queued behind its active run, or replacing it): the
// script that starts that run renames it to the run's Links. A key has at
// most one follow-up waiting, so the list needs no run id.
func (s *Space) FollowUpLinks(k taskkey.Key) string {
	return s.taskKey("links", k) + "|next"
}

// Events is partition p's pub/sub channel of TaskView changes.
func (s *Space) Events(p int) string { return s.events[p] }

// LegacyGroup is the consumer group of the legacy request streams.
const LegacyGroup = "runners"

// Cancels is partition p's pub/sub channel of cancel requests (task keys),
// so a holder stops at once instead of at its next heartbeat.
func (s *Space) Cancels(p int) string { return s.cancels[p] }

// Watch is partition p's watch key: while it exists, scripts publish every
// TaskView change on Events(p). Subscribers keep it alive.
func (s *Space) Watch(p int) string { return s.watch[p] }
