package triggers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// ScheduleStatus is one schedule as GET /v1/schedules shows it (docs/http-api.md):
// cron, scope, subjects (a count or "all"), next occurrence, the last
// occurrence fired and its fan-out progress, and the current leader.
type ScheduleStatus struct {
	// Name, Cron and Scope are the schedule's, as configured (Schedule).
	Name  string `json:"name"`
	Cron  string `json:"cron"`
	Scope string `json:"scope"`
	// Subjects is the number of the schedule's explicit subjects, or "all".
	Subjects SubjectsCount `json:"subjects"`
	// NextOccurrence is the schedule's next occurrence after now (nil when
	// it has none).
	NextOccurrence *time.Time `json:"nextOccurrence,omitempty"`
	// LastOccurrence is the latest claimed occurrence and its fan-out, as
	// long as its state has not expired (stateTTL after its last batch).
	LastOccurrence *FanOutStatus `json:"lastOccurrence,omitempty"`
	// RecentOccurrences are the fan-outs before LastOccurrence, newest
	// first: the states the last claims replaced (up to 50), each finished
	// or abandoned.
	RecentOccurrences []*FanOutStatus `json:"recentOccurrences,omitempty"`
	// Leader is the Owner of the current cron leader, "" when nobody leads.
	Leader string `json:"leader"`
}

// SubjectsCount is a schedule's subjects: a count for an explicit list, or
// "all". It marshals to a JSON number or the string "all".
type SubjectsCount struct {
	// All is true for a "subjects: all" schedule (Count is then 0).
	All bool
	// Count is the length of an explicit subject list.
	Count int
}

// MarshalJSON renders the count, or "all".
func (c SubjectsCount) MarshalJSON() ([]byte, error) {
	if c.All {
		return []byte(`"all"`), nil
	}
	return strconv.AppendInt(nil, int64(c.Count), 10), nil
}

// UnmarshalJSON accepts a number or "all".
func (c *SubjectsCount) UnmarshalJSON(b []byte) error {
	if string(b) == `"all"` {
		*c = SubjectsCount{All: true}
		return nil
	}
	n, err := strconv.Atoi(string(b))
	if err != nil {
		return fmt.Errorf("triggers: subjects: want a count or \"all\", got %s", b)
	}
	*c = SubjectsCount{Count: n}
	return nil
}

// FanOutStatus is an occurrence's fan-out as recorded in Redis. Times are
// Redis time (UTC).
type FanOutStatus struct {
	// Occurrence is the cron time the fan-out serves (whole seconds).
	Occurrence time.Time `json:"occurrence"`
	// Owner claimed the occurrence or last resumed it; Term is its
	// leadership term, the only one allowed to advance the cursor.
	Owner string `json:"owner"`
	Term  int64  `json:"term"`
	// Submitted counts the requests the fan-out recorded; Duplicates the
	// subjects found already reached (a batch re-sent after an error or a
	// crash, a subject listed twice by ZSCAN). Neither makes a second
	// request. Batches counts the batches recorded.
	Submitted  int64 `json:"submitted"`
	Duplicates int64 `json:"duplicates"`
	Batches    int64 `json:"batches"`
	// Position of the cursor. "subjects: all": the partition being scanned
	// (Partitions once done); a list: the index of the next subject of
	// Total.
	Partition  int `json:"partition"`
	Partitions int `json:"partitions,omitempty"`
	Index      int `json:"index"`
	Total      int `json:"total,omitempty"`
	// Done: every subject was reached (or, with Abandoned, the fan-out was
	// too old to resume). Resumes counts takeovers by a later term.
	// StartedAt is the claim's time, UpdatedAt the last write's (a batch, a
	// takeover), FinishedAt when Done was set (nil before).
	Done       bool       `json:"done"`
	Abandoned  bool       `json:"abandoned,omitempty"`
	Resumes    int64      `json:"resumes"`
	StartedAt  time.Time  `json:"startedAt"`
	UpdatedAt  time.Time  `json:"updatedAt"`
	FinishedAt *time.Time `json:"finishedAt,omitempty"`
}

// Status returns every schedule's status, in configuration order: one
// pipelined read of the fan-out states and the leader mutex.
func (s *Scheduler) Status(ctx context.Context) ([]ScheduleStatus, error) {
	pipe := s.rdb.Pipeline()
	leader := pipe.Get(ctx, s.leaderKey)
	states := make([]*redis.MapStringStringCmd, len(s.entries))
	recent := make([]*redis.StringSliceCmd, len(s.entries))
	for i, e := range s.entries {
		states[i] = pipe.HGetAll(ctx, s.stateKey(e.Name))
		recent[i] = pipe.LRange(ctx, s.recentKey(e.Name), 0, -1)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("triggers: schedule status: %w", err)
	}
	owner, err := leader.Result()
	if errors.Is(err, redis.Nil) {
		owner, err = "", nil
	}
	if err != nil {
		return nil, fmt.Errorf("triggers: schedule status: %w", err)
	}
	now := s.now().In(s.loc)
	out := make([]ScheduleStatus, 0, len(s.entries))
	for i, e := range s.entries {
		st := ScheduleStatus{Name: e.Name, Cron: e.Cron, Scope: e.Scope, Leader: owner,
			Subjects: SubjectsCount{All: e.AllSubjects, Count: len(e.Subjects)}}
		if next := e.sched.Next(now); !next.IsZero() {
			next = next.UTC()
			st.NextOccurrence = &next
		}
		h, err := states[i].Result()
		if err != nil {
			return nil, fmt.Errorf("triggers: schedule status %s: %w", e.Name, err)
		}
		withTotal := func(f *FanOutStatus) *FanOutStatus {
			if e.AllSubjects {
				f.Partitions = s.reg.Partitions()
			} else {
				f.Total = len(e.Subjects)
			}
			return f
		}
		if len(h) > 0 {
			st.LastOccurrence = withTotal(parseFanOutStatus(h))
		}
		past, err := recent[i].Result()
		if err != nil {
			return nil, fmt.Errorf("triggers: schedule status %s: %w", e.Name, err)
		}
		for _, js := range slices.Backward(past) {
			f, err := ParseRecentFanOut(js)
			if err != nil {
				return nil, fmt.Errorf("triggers: schedule status %s: %w", e.Name, err)
			}
			st.RecentOccurrences = append(st.RecentOccurrences, withTotal(f))
		}
		out = append(out, st)
	}
	return out, nil
}

// ParseRecentFanOut reads one entry of a schedule's recent fan-outs (a
// JSON object of a replaced state's fields, lua/cron_claim.lua).
func ParseRecentFanOut(js string) (*FanOutStatus, error) {
	var h map[string]string
	if err := json.Unmarshal([]byte(js), &h); err != nil {
		return nil, fmt.Errorf("recent fan-out %q: %w", js, err)
	}
	return parseFanOutStatus(h), nil
}

// parseFanOutStatus reads a fan-out state hash (lua/cron_claim.lua).
func parseFanOutStatus(h map[string]string) *FanOutStatus {
	i64 := func(k string) int64 {
		n, _ := strconv.ParseInt(h[k], 10, 64)
		return n
	}
	ms := func(k string) time.Time { return time.UnixMilli(i64(k)).UTC() }
	f := &FanOutStatus{
		Occurrence: unixSeconds(h["occ"]), Owner: h["owner"], Term: i64("term"),
		Submitted: i64("submitted"), Duplicates: i64("duplicates"), Batches: i64("batches"),
		Partition: int(i64("part")), Index: int(i64("index")),
		Done: h["done"] == "1", Abandoned: h["abandoned"] == "1", Resumes: i64("resumes"),
		StartedAt: ms("startedAt"), UpdatedAt: ms("updatedAt"),
	}
	if _, ok := h["finishedAt"]; ok {
		t := ms("finishedAt")
		f.FinishedAt = &t
	}
	return f
}
