package keyspace_test

import (
	"errors"
	"fmt"
	"hash/crc32"
	"strings"
	"testing"

	"github.com/tasklease/tasklease/internal/keyspace"
	"github.com/tasklease/tasklease/taskkey"
)

func TestNewDefaults(t *testing.T) {
	s, err := keyspace.New("", 0)
	if err != nil {
		t.Fatalf("New(\"\", 0): %v", err)
	}
	if s.Prefix() != keyspace.PrefixDefault || s.Prefix() != "tasklease" {
		t.Errorf("Prefix = %q, want %q", s.Prefix(), keyspace.PrefixDefault)
	}
	if s.Partitions() != keyspace.PartitionsDefault || s.Partitions() != 16 {
		t.Errorf("Partitions = %d, want %d", s.Partitions(), keyspace.PartitionsDefault)
	}
	if got := s.Tag(3); got != "{tasklease:p3}" {
		t.Errorf("Tag(3) = %q", got)
	}
}

func TestNewValidation(t *testing.T) {
	tests := []struct {
		prefix     string
		partitions int
		ok         bool
	}{
		{"tl", 1, true},
		{"my-app.prod:v2", keyspace.PartitionsMax, true},
		{"A", 7, true},
		{strings.Repeat("p", 64), 16, true},
		{strings.Repeat("p", 65), 16, false},
		{"-tl", 16, false},
		{"t l", 16, false},
		{"t{l}", 16, false},
		{"t|l", 16, false},
		{"tl", -1, false},
		{"tl", keyspace.PartitionsMax + 1, false},
	}
	for _, tt := range tests {
		s, err := keyspace.New(tt.prefix, tt.partitions)
		if tt.ok {
			if err != nil {
				t.Errorf("New(%q, %d) = %v, want ok", tt.prefix, tt.partitions, err)
			} else if s.Prefix() != tt.prefix || s.Partitions() != tt.partitions {
				t.Errorf("New(%q, %d) = %q/%d", tt.prefix, tt.partitions, s.Prefix(), s.Partitions())
			}
			continue
		}
		if err == nil {
			t.Errorf("New(%q, %d) succeeded, want error", tt.prefix, tt.partitions)
			continue
		}
		if !errors.Is(err, keyspace.ErrConfig) {
			t.Errorf("New(%q, %d) = %v, want errors.Is ErrConfig", tt.prefix, tt.partitions, err)
		}
		if s != nil {
			t.Errorf("New(%q, %d) returned a Space with its error", tt.prefix, tt.partitions)
		}
	}
}

func TestPartitionStableAndInRange(t *testing.T) {
	for _, n := range []int{1, 2, 16, 1000, keyspace.PartitionsMax} {
		s, err := keyspace.New("tl", n)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 500 {
			k := taskkey.MustNew(fmt.Sprintf("u%d", i), "course_sync")
			p := s.Partition(k)
			if p < 0 || p >= n {
				t.Fatalf("partitions %d: Partition(%s) = %d out of range", n, k, p)
			}
			if again := s.Partition(k); again != p {
				t.Fatalf("partitions %d: Partition(%s) = %d then %d", n, k, p, again)
			}
			// DESIGN §2.7: p = crc32(taskKey) % partitions, so other
			// implementations (and a restarted runner) agree.
			if want := int(crc32.ChecksumIEEE([]byte(k.String())) % uint32(n)); p != want {
				t.Fatalf("partitions %d: Partition(%s) = %d, want crc32 %% n = %d", n, k, p, want)
			}
		}
	}
	// Stable across Space instances and independent of the prefix.
	a, _ := keyspace.New("a", 16)
	b, _ := keyspace.New("b", 16)
	k := taskkey.MustNew("u42", "course_sync")
	if a.Partition(k) != b.Partition(k) {
		t.Fatalf("partition depends on the prefix: %d vs %d", a.Partition(k), b.Partition(k))
	}
	// A known value, so a change of hash function cannot go unnoticed.
	if got, want := a.Partition(k), int(crc32.ChecksumIEEE([]byte("u42|course_sync"))%16); got != want {
		t.Fatalf("Partition(u42|course_sync) = %d, want %d", got, want)
	}
}

func TestKeysShareTag(t *testing.T) {
	s, err := keyspace.New("tl", 16)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for i := range 200 {
		k := taskkey.MustNew(fmt.Sprintf("subject-%d", i), "message_sync")
		p := s.Partition(k)
		tag := fmt.Sprintf("{tl:p%d}", p)
		if s.Tag(p) != tag {
			t.Fatalf("Tag(%d) = %q, want %q", p, s.Tag(p), tag)
		}
		keys := map[string]string{
			"lease": s.Lease(k), "fence": s.Fence(k), "task": s.Task(k), "history": s.History(k),
			"hist": s.LegacyHistory(k),
		}
		for kind, key := range keys {
			want := tag + ":" + kind + ":" + k.String()
			if key != want {
				t.Fatalf("%s key of %s = %q, want %q", kind, k, key, want)
			}
			if seen[key] {
				t.Fatalf("key %q produced twice", key)
			}
			seen[key] = true
			// Redis Cluster hashes only the first {...}: it must be the tag.
			if lo, hi := strings.Index(key, "{"), strings.Index(key, "}"); key[lo:hi+1] != tag {
				t.Fatalf("%s key %q: first hash tag is %q, want %q", kind, key, key[lo:hi+1], tag)
			}
		}
		// Partition-wide keys share the tag of the partition's tasks.
		partKeys := append([]string{s.Retry(p), s.Index(p), s.Subjects(p, "message_sync"), s.Events(p),
			s.LegacyStream(p, keyspace.LaneBulk), s.LegacyStream(p, keyspace.LanePeople)}, s.QueueKeys(p)...)
		for _, key := range partKeys {
			if !strings.HasPrefix(key, tag+":") {
				t.Fatalf("partition key %q lacks tag %q", key, tag)
			}
		}
	}
	// Distinct per-partition names.
	p := 0
	names := append([]string{s.Retry(p), s.Index(p), s.Subjects(p, "a"), s.Subjects(p, "b"), s.Events(p),
		s.LegacyStream(p, keyspace.LaneBulk), s.LegacyStream(p, keyspace.LanePeople)}, s.QueueKeys(p)...)
	uniq := map[string]bool{}
	for _, n := range names {
		uniq[n] = true
	}
	if len(uniq) != len(names) {
		t.Fatalf("partition key names collide: %v", names)
	}
}

func TestDistribution(t *testing.T) {
	s, err := keyspace.New("", 16)
	if err != nil {
		t.Fatal(err)
	}
	counts := make([]int, 16)
	for i := range 10000 {
		counts[s.Partition(taskkey.MustNew(fmt.Sprintf("u%d", i), "course_sync"))]++
	}
	for p, n := range counts {
		if n < 400 || n > 850 {
			t.Errorf("partition %d holds %d of 10000 keys, want 400..850 (counts %v)", p, n, counts)
		}
	}
}

func TestPartitionIsCRC32OfTheKey(t *testing.T) {
	s, err := keyspace.New("tl", 16)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 500 {
		k := taskkey.MustNew(fmt.Sprintf("subject-%d", i), "message_sync")
		if got, want := s.Partition(k), int(crc32.ChecksumIEEE([]byte(k.String()))%16); got != want {
			t.Fatalf("Partition(%s) = %d, want crc32 %% 16 = %d", k, got, want)
		}
	}
}
