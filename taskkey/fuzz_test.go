package taskkey_test

import (
	"regexp"
	"strings"
	"testing"

	"github.com/tasklease/tasklease/taskkey"
)

// The regexes of DESIGN §1, checked independently of the hand-written
// validators.
var (
	subjectRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@:-]{0,127}$`)
	scopeRE   = regexp.MustCompile(`^[a-z][a-z0-9_]{0,63}$`)
)

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"u42|course_sync",
		"user.name@example.com|backup",
		"a|b",
		"a|b|c",
		"|",
		"",
		"u42",
		"u42|",
		"|course_sync",
		"-u|x",
		"u42|Course",
		strings.Repeat("a", 128) + "|" + strings.Repeat("b", 64),
		strings.Repeat("a", 129) + "|b",
		"ü|x",
		"u\x00|x",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		k, err := taskkey.Parse(s)
		// Parse must agree with the regexes on every input.
		subject, scope, hasSep := strings.Cut(s, taskkey.Separator)
		want := hasSep && subjectRE.MatchString(subject) && scopeRE.MatchString(scope)
		if err != nil {
			if want {
				t.Fatalf("Parse(%q) = %v, but the parts match the regexes", s, err)
			}
			if !k.IsZero() {
				t.Fatalf("Parse(%q) failed but returned non-zero key %q", s, k)
			}
			return
		}
		if !want {
			t.Fatalf("Parse(%q) succeeded (%q/%q) but the parts do not match the regexes", s, k.Subject(), k.Scope())
		}
		if got := k.String(); got != s {
			t.Fatalf("Parse(%q).String() = %q", s, got)
		}
		if k.IsZero() {
			t.Fatalf("Parse(%q) returned a zero key", s)
		}
		if !subjectRE.MatchString(k.Subject()) || !scopeRE.MatchString(k.Scope()) {
			t.Fatalf("Parse(%q) parts %q/%q do not match the regexes", s, k.Subject(), k.Scope())
		}
		k2, err := taskkey.New(k.Subject(), k.Scope())
		if err != nil {
			t.Fatalf("New(%q, %q) = %v after Parse succeeded", k.Subject(), k.Scope(), err)
		}
		if k2 != k {
			t.Fatalf("New = %q, Parse = %q", k2, k)
		}
	})
}
