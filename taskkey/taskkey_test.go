package taskkey_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/tasklease/tasklease/taskkey"
)

func TestValidateSubject(t *testing.T) {
	long := strings.Repeat("a", taskkey.MaxSubjectLen)
	tests := []struct {
		subject string
		ok      bool
	}{
		{"u42", true},
		{"U", true},
		{"7", true},
		{"user.name_1@example.com", true},
		{"tenant:42-a", true},
		{"a._@:-", true},
		{long, true},
		{long + "a", false},
		{"", false},
		{".u42", false},
		{"_u", false},
		{"@u", false},
		{":u", false},
		{"-u", false},
		{"u 42", false},
		{"u|42", false},
		{"u/42", false},
		{"u{42}", false},
		{"u\n", false},
		{"ü42", false},
		{"u\x00", false},
	}
	for _, tt := range tests {
		err := taskkey.ValidateSubject(tt.subject)
		if tt.ok && err != nil {
			t.Errorf("ValidateSubject(%q) = %v, want nil", tt.subject, err)
		}
		if !tt.ok {
			if err == nil {
				t.Errorf("ValidateSubject(%q) = nil, want error", tt.subject)
				continue
			}
			checkErr(t, err, "subject", tt.subject)
		}
	}
}

func TestValidateScope(t *testing.T) {
	long := "a" + strings.Repeat("b", taskkey.MaxScopeLen-1)
	tests := []struct {
		scope string
		ok    bool
	}{
		{"course_sync", true},
		{"a", true},
		{"a1_b2", true},
		{"backup_", true},
		{long, true},
		{long + "c", false},
		{"", false},
		{"Course_sync", false},
		{"course_Sync", false},
		{"1course", false},
		{"_course", false},
		{"course-sync", false},
		{"course.sync", false},
		{"course sync", false},
		{"b|c", false},
		{"course:sync", false},
	}
	for _, tt := range tests {
		err := taskkey.ValidateScope(tt.scope)
		if tt.ok && err != nil {
			t.Errorf("ValidateScope(%q) = %v, want nil", tt.scope, err)
		}
		if !tt.ok {
			if err == nil {
				t.Errorf("ValidateScope(%q) = nil, want error", tt.scope)
				continue
			}
			checkErr(t, err, "scope", tt.scope)
		}
	}
}

// checkErr asserts err is a *taskkey.Error about part with value, wrapping
// ErrInvalid.
func checkErr(t *testing.T, err error, part, value string) {
	t.Helper()
	if !errors.Is(err, taskkey.ErrInvalid) {
		t.Errorf("error %v: errors.Is(ErrInvalid) = false", err)
	}
	var te *taskkey.Error
	if !errors.As(err, &te) {
		t.Fatalf("error %v (%T): errors.As(*taskkey.Error) = false", err, err)
	}
	if te.Part != part || te.Value != value || te.Reason == "" {
		t.Errorf("error = %+v, want Part %q Value %q and a reason", te, part, value)
	}
	if !strings.HasPrefix(err.Error(), "invalid task key: "+part) {
		t.Errorf("message %q does not name part %q", err.Error(), part)
	}
}

func TestNew(t *testing.T) {
	k, err := taskkey.New("u42", "course_sync")
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if k.Subject() != "u42" || k.Scope() != "course_sync" || k.String() != "u42|course_sync" || k.IsZero() {
		t.Fatalf("New = %+v (%q), want u42|course_sync", k, k.String())
	}
	if _, err := taskkey.New("", "course_sync"); err == nil {
		t.Fatal("New with empty subject succeeded")
	} else {
		checkErr(t, err, "subject", "")
	}
	if _, err := taskkey.New("u42", "Bad"); err == nil {
		t.Fatal("New with bad scope succeeded")
	} else {
		checkErr(t, err, "scope", "Bad")
	}
	// Subject is checked first when both are bad.
	if _, err := taskkey.New("-", "-"); err == nil {
		t.Fatal("New(-, -) succeeded")
	} else {
		checkErr(t, err, "subject", "-")
	}
	if !(taskkey.Key{}).IsZero() {
		t.Fatal("zero Key is not IsZero")
	}
}

func TestMustNew(t *testing.T) {
	if k := taskkey.MustNew("u1", "backup"); k.String() != "u1|backup" {
		t.Fatalf("MustNew = %q", k)
	}
	defer func() {
		r := recover()
		err, ok := r.(error)
		if !ok || !errors.Is(err, taskkey.ErrInvalid) {
			t.Fatalf("MustNew of a bad key panicked with %v, want an ErrInvalid error", r)
		}
	}()
	taskkey.MustNew("u1", "")
	t.Fatal("MustNew of a bad key did not panic")
}

func TestParse(t *testing.T) {
	tests := []struct {
		in               string
		subject, scope   string
		errPart, errValu string // errPart "" means valid
	}{
		{in: "u42|course_sync", subject: "u42", scope: "course_sync"},
		{in: "user@example.com|backup", subject: "user@example.com", scope: "backup"},
		{in: "a|b", subject: "a", scope: "b"},
		{in: "u42course_sync", errPart: "key", errValu: "u42course_sync"},
		{in: "", errPart: "key", errValu: ""},
		{in: "|", errPart: "subject", errValu: ""},
		{in: "|course_sync", errPart: "subject", errValu: ""},
		{in: "u42|", errPart: "scope", errValu: ""},
		// The subject cannot contain "|": the first one separates, so the
		// rest lands in the scope, which rejects "|".
		{in: "a|b|c", errPart: "scope", errValu: "b|c"},
		{in: "u42||course_sync", errPart: "scope", errValu: "|course_sync"},
		{in: "u 42|course_sync", errPart: "subject", errValu: "u 42"},
		{in: "u42|Course_sync", errPart: "scope", errValu: "Course_sync"},
		{in: "u42 |course_sync", errPart: "subject", errValu: "u42 "},
		{in: "u42| course_sync", errPart: "scope", errValu: " course_sync"},
	}
	for _, tt := range tests {
		k, err := taskkey.Parse(tt.in)
		if tt.errPart == "" {
			if err != nil {
				t.Errorf("Parse(%q) = %v, want ok", tt.in, err)
				continue
			}
			if k.Subject() != tt.subject || k.Scope() != tt.scope || k.String() != tt.in {
				t.Errorf("Parse(%q) = %q/%q (%q), want %q/%q", tt.in, k.Subject(), k.Scope(), k, tt.subject, tt.scope)
			}
			continue
		}
		if err == nil {
			t.Errorf("Parse(%q) = %q, want an error about %s", tt.in, k, tt.errPart)
			continue
		}
		if !k.IsZero() {
			t.Errorf("Parse(%q) returned non-zero key %q with error", tt.in, k)
		}
		checkErr(t, err, tt.errPart, tt.errValu)
	}
}

func TestErrorTruncatesLongValue(t *testing.T) {
	long := strings.Repeat("x", 500)
	_, err := taskkey.Parse(long)
	if err == nil {
		t.Fatal("Parse of 500 x succeeded")
	}
	var te *taskkey.Error
	if !errors.As(err, &te) || te.Value != long {
		t.Fatalf("Error.Value not the full input: %v", err)
	}
	if n := len(err.Error()); n > 200 {
		t.Fatalf("message is %d bytes long, want it truncated: %q", n, err.Error())
	}
}
