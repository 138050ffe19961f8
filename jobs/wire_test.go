package jobs

import (
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/tasklease/tasklease/lua"
)

// TestViewFieldsMatchLua: submit.lua replies with the values of
// VIEW_FIELDS (lib/submitting.lua) in order; viewFieldNames[:] must name the same fields in
// the same order.
func TestViewFieldsMatchLua(t *testing.T) {
	src, err := lua.Source("submit")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)local VIEW_FIELDS = \{(.*?)\}`).FindStringSubmatch(src)
	if m == nil {
		t.Fatal("VIEW_FIELDS not found in submit.lua's source")
	}
	var got []string
	for _, q := range regexp.MustCompile(`'([A-Za-z]+)'`).FindAllStringSubmatch(m[1], -1) {
		got = append(got, q[1])
	}
	if !slices.Equal(got, viewFieldNames[:]) {
		t.Fatalf("VIEW_FIELDS %v, viewFieldNames[:] %v", got, viewFieldNames[:])
	}
	m = regexp.MustCompile(`(?s)local SUBMIT_READ = \{(.*?)\}`).FindStringSubmatch(src)
	if m == nil {
		t.Fatal("SUBMIT_READ not found in submit.lua's source")
	}
	var read []string
	for _, q := range regexp.MustCompile(`'([A-Za-z]+)'`).FindAllStringSubmatch(m[1], -1) {
		read = append(read, q[1])
	}
	if len(read) < len(viewFieldNames[:]) || !slices.Equal(read[:len(viewFieldNames[:])], viewFieldNames[:]) {
		t.Fatalf("SUBMIT_READ %v must start with VIEW_FIELDS %v (a reply is cut from its HMGET)", read, viewFieldNames[:])
	}
	if !strings.Contains(src, "'\\31'") || histSep != "\x1f" {
		t.Fatal("the history/view separator differs between Lua (US, \\31) and Go")
	}
}

// TestRequestLettersMatchLua: submit.lua's request argument names policy
// and source by their first letters (requestArg); POLICY_OF and SOURCE_OF
// in lib/submitting.lua must name every Policy and Source by its own,
// and no two may share one.
func TestRequestLettersMatchLua(t *testing.T) {
	src, err := lua.Source("submit")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		table string
		names []string
	}{
		{"POLICY_OF", []string{string(PolicyJoin), string(PolicySkip), string(PolicyQueue), string(PolicyReplace)}},
		{"SOURCE_OF", []string{string(SourceManual), string(SourceForeground), string(SourceSchedule), string(SourceRetry)}},
	} {
		m := regexp.MustCompile(`local ` + tc.table + ` = \{(.*?)\}`).FindStringSubmatch(src)
		if m == nil {
			t.Fatalf("%s not found in submit.lua's source", tc.table)
		}
		lua := map[byte]string{}
		for _, e := range regexp.MustCompile(`\[(\d+)\] = '([a-z]+)'`).FindAllStringSubmatch(m[1], -1) {
			b, err := strconv.Atoi(e[1])
			if err != nil || b > 255 {
				t.Fatalf("%s: bad byte %q", tc.table, e[1])
			}
			lua[byte(b)] = e[2]
		}
		if len(lua) != len(tc.names) {
			t.Errorf("%s names %d, want %d: %v", tc.table, len(lua), len(tc.names), lua)
		}
		for _, name := range tc.names {
			if lua[name[0]] != name {
				t.Errorf("%s[%d] = %q, want %q (its first letter)", tc.table, name[0], lua[name[0]], name)
			}
		}
	}
}
