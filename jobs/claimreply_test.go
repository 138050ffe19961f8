package jobs

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"
)

// grantReply is a grant as lib/claiming.lua claim_entry sends it.
func grantReply(token, done, attempt, stages, sources, started, prev, cursor string) []any {
	return []any{strings.Join([]string{"granted", token, done, attempt, stages, sources, started, prev, cursor}, histSep)}
}

func replyRunner() *Runner {
	return &Runner{reg: &Registry{}, cfg: RunnerConfig{LeaseTTL: 7 * time.Second}}
}

// A grant travels as one string; its cursor is last and may hold any byte,
// the field separator included.
func TestDecodeGrant(t *testing.T) {
	r := replyRunner()
	e, ok := entryFrom(0, "pr1"+histSep+"u1|sync"+histSep+"manual")
	if !ok {
		t.Fatal("entryFrom refused a valid entry")
	}
	cursor := "page=3" + histSep + "\x00\xff\x1e" + histSep
	c, err := r.decodeClaim(grantReply("1733200000123456", "1", "2", "pull,push", "manual,schedule", "1733200000123", "retrying", cursor), e, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if c.kind != claimGranted || c.token != 1733200000123456 || c.done != 1 || c.attempt != 2 ||
		!slices.Equal(c.stages, []string{"pull", "push"}) || !slices.Equal(c.sources, []Source{SourceManual, SourceSchedule}) ||
		c.prevStatus != StatusRetrying || !bytes.Equal(c.cursor, []byte(cursor)) || c.ttl != 7*time.Second {
		t.Fatalf("decoded %+v", c)
	}
	c, err = r.decodeClaim(grantReply("5", "0", "1", "pull", "manual", "1", "queued", ""), e, time.Time{})
	if err != nil || c.cursor != nil || c.done != 0 || c.attempt != 1 {
		t.Fatalf("no cursor: %+v, %v", c, err)
	}
	// the other replies stay tables of their own kind
	for _, v := range [][]any{{"ack"}, {"paused"}, {"busy", "5|o", int64(300)}, {"foreign", "push"}} {
		c, err := r.decodeClaim(v, e, time.Time{})
		if err != nil || string(c.kind) != v[0] {
			t.Errorf("decodeClaim(%v) = %+v, %v", v, c, err)
		}
	}
	for _, bad := range [][]any{
		grantReply("x", "0", "1", "pull", "manual", "1", "queued", ""),
		{"granted" + histSep + "1"},
		{"granted"}, // a grant without its fields
	} {
		if c, err := r.decodeClaim(bad, e, time.Time{}); err == nil {
			t.Errorf("decodeClaim(%q) = %+v, want an error", bad, c)
		}
	}
}

// FuzzDecodeClaim: no reply string makes decoding panic, and a grant
// decoded keeps its cursor byte for byte.
func FuzzDecodeClaim(f *testing.F) {
	f.Add("granted\x1f7\x1f0\x1f1\x1fpull\x1fmanual\x1f1\x1fqueued\x1fcur\x1fsor")
	f.Add("granted\x1f")
	f.Add("ack")
	f.Fuzz(func(t *testing.T, s string) {
		r := replyRunner()
		e, _ := entryFrom(0, "pr1"+histSep+"u1|sync"+histSep+"manual")
		c, err := r.decodeClaim([]any{s}, e, time.Time{})
		if err != nil || c.kind != claimGranted {
			return
		}
		if f := strings.SplitN(s, histSep, 9); f[8] != string(c.cursor) {
			t.Fatalf("cursor %q, want %q", c.cursor, f[8])
		}
	})
}
