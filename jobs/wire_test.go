package jobs

import (
	"regexp"
	"slices"
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
