// Package taskkey parses and validates tasklease task keys.
//
// A task key names one business task: "<subject>|<scope>", for example
// "u42|course_sync". The subject is usually a user or account id; the scope is
// a configured job. Deduplication in tasklease is by task key only, so two
// different subjects (an account switch) or two scopes never block each other.
//
// Validation happens here, before anything reaches Redis: an invalid key is a
// *taskkey.Error that wraps ErrInvalid.
package taskkey

import (
	"errors"
	"fmt"
	"strings"
)

// Separator joins subject and scope in a task key.
const Separator = "|"

// Length limits of the two parts (docs/concepts.md).
const (
	// MaxSubjectLen is the longest subject ValidateSubject accepts, in bytes.
	MaxSubjectLen = 128
	// MaxScopeLen is the longest scope ValidateScope accepts, in bytes.
	MaxScopeLen = 64
)

// ErrInvalid is wrapped by every validation error of this package.
var ErrInvalid = errors.New("invalid task key")

// Error describes which part of a key is invalid and why.
type Error struct {
	Part string // "key", "subject" or "scope"
	// Value is the rejected input: the whole key, the subject or the scope
	// (Error truncates it to 80 bytes in its message).
	Value string
	// Reason says what is wrong, e.g. "empty" or "must start with a
	// lower-case letter".
	Reason string
}

// Error implements error: "invalid task key: <part> <value>: <reason>".
func (e *Error) Error() string {
	return fmt.Sprintf("invalid task key: %s %q: %s", e.Part, truncate(e.Value, 80), e.Reason)
}

// Unwrap lets callers test errors.Is(err, taskkey.ErrInvalid).
func (e *Error) Unwrap() error { return ErrInvalid }

// Key is a validated task key. The zero Key is invalid; obtain one from New or
// Parse.
type Key struct {
	subject string
	scope   string
	s       string // "<subject>|<scope>", joined once: keys are formatted on every Redis call
}

// New validates subject and scope and returns their key.
func New(subject, scope string) (Key, error) {
	if err := ValidateSubject(subject); err != nil {
		return Key{}, err
	}
	if err := ValidateScope(scope); err != nil {
		return Key{}, err
	}
	return Key{subject: subject, scope: scope, s: subject + Separator + scope}, nil
}

// MustNew is New for constants in tests and examples; it panics on bad input.
func MustNew(subject, scope string) Key {
	k, err := New(subject, scope)
	if err != nil {
		panic(err)
	}
	return k
}

// Parse validates "<subject>|<scope>".
func Parse(s string) (Key, error) {
	subject, scope, ok := strings.Cut(s, Separator)
	if !ok {
		return Key{}, &Error{Part: "key", Value: s, Reason: `want "<subject>|<scope>"`}
	}
	return New(subject, scope)
}

// Subject returns the subject part, e.g. "u42".
func (k Key) Subject() string { return k.subject }

// Scope returns the scope part, e.g. "course_sync".
func (k Key) Scope() string { return k.scope }

// String returns "<subject>|<scope>".
func (k Key) String() string {
	if k.s == "" {
		return k.subject + Separator + k.scope
	}
	return k.s
}

// IsZero reports whether k is the zero (invalid) Key.
func (k Key) IsZero() bool { return k.subject == "" }

// ValidateSubject checks ^[A-Za-z0-9][A-Za-z0-9._@:-]{0,127}$.
func ValidateSubject(s string) error {
	if s == "" {
		return &Error{Part: "subject", Value: s, Reason: "empty"}
	}
	if len(s) > MaxSubjectLen {
		return &Error{Part: "subject", Value: s, Reason: fmt.Sprintf("longer than %d bytes", MaxSubjectLen)}
	}
	if !isAlnum(s[0]) {
		return &Error{Part: "subject", Value: s, Reason: "must start with a letter or digit"}
	}
	for i := 1; i < len(s); i++ {
		c := s[i]
		if !isAlnum(c) && c != '.' && c != '_' && c != '@' && c != ':' && c != '-' {
			return &Error{Part: "subject", Value: s, Reason: fmt.Sprintf("character %q not allowed (letters, digits, . _ @ : -)", c)}
		}
	}
	return nil
}

// ValidateScope checks ^[a-z][a-z0-9_]{0,63}$.
func ValidateScope(s string) error {
	if s == "" {
		return &Error{Part: "scope", Value: s, Reason: "empty"}
	}
	if len(s) > MaxScopeLen {
		return &Error{Part: "scope", Value: s, Reason: fmt.Sprintf("longer than %d bytes", MaxScopeLen)}
	}
	if s[0] < 'a' || s[0] > 'z' {
		return &Error{Part: "scope", Value: s, Reason: "must start with a lower-case letter"}
	}
	for i := 1; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z') && !(c >= '0' && c <= '9') && c != '_' {
			return &Error{Part: "scope", Value: s, Reason: fmt.Sprintf("character %q not allowed (a-z, 0-9, _)", c)}
		}
	}
	return nil
}

func isAlnum(c byte) bool {
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
